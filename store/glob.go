package store

// GlobMatch reports whether key matches pattern as Redis's SCAN MATCH
// (stringmatchlen) does: * any run of bytes ('/' included, unlike
// path.Match), ? any one byte, [set] one byte of the set ([^set] not of
// it; a-z ranges), \x the byte x. KeyMatch.Glob is such a pattern; another
// instance told of a reset by pattern selects its keys with it.
func GlobMatch(pattern, key string) bool {
	for len(pattern) > 0 {
		switch pattern[0] {
		case '*':
			for len(pattern) > 1 && pattern[1] == '*' {
				pattern = pattern[1:]
			}
			if len(pattern) == 1 {
				return true
			}
			for i := 0; i <= len(key); i++ {
				if GlobMatch(pattern[1:], key[i:]) {
					return true
				}
			}
			return false
		case '?':
			if len(key) == 0 {
				return false
			}
		case '[':
			if len(key) == 0 {
				return false
			}
			p, ok := matchSet(pattern[1:], key[0])
			if !ok {
				return false
			}
			pattern, key = p, key[1:]
			continue
		case '\\':
			if len(pattern) > 1 {
				pattern = pattern[1:]
			}
			fallthrough
		default:
			if len(key) == 0 || pattern[0] != key[0] {
				return false
			}
		}
		pattern, key = pattern[1:], key[1:]
	}
	return len(key) == 0
}

// matchSet matches c against the set that pattern starts with (after its
// '['), and returns the pattern after the set's ']' (an unclosed set ends
// with the pattern, as in Redis).
func matchSet(pattern string, c byte) (rest string, ok bool) {
	not := len(pattern) > 0 && pattern[0] == '^'
	if not {
		pattern = pattern[1:]
	}
	match := false
	for len(pattern) > 0 && pattern[0] != ']' {
		switch {
		case pattern[0] == '\\' && len(pattern) > 1:
			pattern = pattern[1:]
			match = match || pattern[0] == c
		case len(pattern) > 2 && pattern[1] == '-':
			lo, hi := pattern[0], pattern[2]
			if lo > hi {
				lo, hi = hi, lo
			}
			match = match || lo <= c && c <= hi
			pattern = pattern[2:]
		default:
			match = match || pattern[0] == c
		}
		pattern = pattern[1:]
	}
	if len(pattern) > 0 {
		pattern = pattern[1:] // the ']'
	}
	return pattern, match != not
}
