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

// StandaloneGETs counts the GET requests of session sid's standalone
// stream being served.
func (s *Server) StandaloneGETs(sid string) int {
	s.events.mu.Lock()
	defer s.events.mu.Unlock()
	if st := s.events.standalone[sid]; st != nil {
		return st.open
	}
	return 0
}
