package mcpserver

// Doors counts the servers kept: aggregates, device servers, and the
// device index's entries.
func (s *Server) Doors() (aggregates, devices, indexed int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ds := range s.byDevice {
		indexed += len(ds)
	}
	return len(s.agg), len(s.devices), indexed
}
