package store

// RedactDSN returns dsn with its password replaced, for logs and reports
// (the bench prints the store it ran on).
func RedactDSN(dsn string) string { return redactDSN(dsn) }
