package cephstore

// HeaderMeta is headerMeta, for the tests.
func (s *Store) HeaderMeta(name string) (map[string]string, bool, error) { return s.headerMeta(name) }
