package lease

// Closing reports whether Close has begun on s: it holds, or waits for,
// the lock that grants in flight hold for reading (a test's hook inside a
// grant can so wait for Close to be waiting on that grant).
func Closing(s *Store) bool {
	if s.life.TryRLock() {
		s.life.RUnlock()
		return false
	}
	return true
}
