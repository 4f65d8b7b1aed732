package lease

// DecodeReset is decodeReset: the reset message b's keys and glob, or why
// it is refused.
func DecodeReset(b []byte) (keys []string, glob string, err error) {
	m, err := decodeReset(b)
	return m.Keys, m.Glob, err
}

// EncodeReset is encodeReset.
func EncodeReset(from string, keys []string, glob string) [][]byte {
	return encodeReset(from, keys, glob)
}
