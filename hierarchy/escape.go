package hierarchy

import (
	"crypto/sha256"
	"encoding/base64"
)

// maxEscaped bounds the length of one escaped value in a key. Longer values
// are hashed, so no client can grow a key without bound.
const maxEscaped = 64

// Escape turns a client-supplied value into a safe key segment. Letters,
// digits and "-_.@:+" are kept; every other byte is percent-encoded, so no
// value can contain the separators of a key ("{", "}", "|", "/", "=", "#")
// and two different values never escape alike. A value whose escaped form
// would exceed 64 bytes becomes "~" followed by the unpadded base64url of
// its SHA-256: "~" is never left unescaped, so a hashed value cannot
// collide with an escaped one.
func Escape(v string) string {
	n := 0
	for i := 0; i < len(v); i++ {
		if safe(v[i]) {
			n++
		} else {
			n += 3
		}
	}
	if n > maxEscaped {
		sum := sha256.Sum256([]byte(v))
		return "~" + base64.RawURLEncoding.EncodeToString(sum[:])
	}
	if n == len(v) {
		return v
	}
	const hex = "0123456789ABCDEF"
	out := make([]byte, 0, n)
	for i := 0; i < len(v); i++ {
		c := v[i]
		if safe(c) {
			out = append(out, c)
		} else {
			out = append(out, '%', hex[c>>4], hex[c&15])
		}
	}
	return string(out)
}

func safe(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	switch c {
	case '-', '_', '.', '@', ':', '+':
		return true
	}
	return false
}
