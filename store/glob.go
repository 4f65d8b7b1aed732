package store

// GlobMatch reports whether key matches pattern as Redis's SCAN MATCH
// (stringmatchlen) does: * any run of bytes ('/' included, unlike
// path.Match), ? any one byte, [set] one byte of the set ([^set] not of
// it; a-z ranges), \x the byte x. KeyMatch.Glob is such a pattern; another
// instance told of a reset by pattern selects its keys with it.
//
// It takes O(len(pattern)·len(key)) steps whatever the pattern: the
// pattern may come from another process (a reset told over Pub/Sub), and
// the recursive backtracking it replaced took exponential time on patterns
// such as *a*a*a*a*b (see globMatch).
func GlobMatch(pattern, key string) bool {
	match, _ := globMatch(pattern, key)
	return match
}

// globMatch is GlobMatch, and how many steps (pattern elements tried
// against a byte of key) it took. It is the greedy matcher with one
// backtrack point: every element but * matches exactly one byte, so when
// the rest of the pattern fails after a *, only the LAST * need take one
// more byte — an earlier * taking more could only shift where the last *
// starts, which the last * covers by itself. Each backtrack advances the
// last *'s start by one byte of key, and between two backtracks the
// pattern is walked at most once: at most (len(pattern)+1)·(len(key)+1)
// steps.
func globMatch(pattern, key string) (match bool, steps int) {
	p, k := 0, 0
	star, from := -1, 0 // the pattern after the last *, and where in key that * stops
	for k < len(key) {
		steps++
		if p < len(pattern) {
			if pattern[p] == '*' {
				for p < len(pattern) && pattern[p] == '*' {
					p++
				}
				if p == len(pattern) {
					return true, steps // a trailing * takes the rest
				}
				star, from = p, k
				continue
			}
			if next, ok := matchByte(pattern, p, key[k]); ok {
				p, k = next, k+1
				continue
			}
		}
		if star < 0 {
			return false, steps
		}
		from++ // the last * takes one byte more
		p, k = star, from
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern), steps
}

// matchByte matches c against the element of pattern at p (not a *), and
// returns where the next element starts.
func matchByte(pattern string, p int, c byte) (next int, ok bool) {
	switch pattern[p] {
	case '?':
		return p + 1, true
	case '[':
		rest, ok := matchSet(pattern[p+1:], c)
		return len(pattern) - len(rest), ok
	case '\\':
		if p+1 < len(pattern) {
			return p + 2, pattern[p+1] == c
		}
	}
	return p + 1, pattern[p] == c // a trailing \ is itself
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
