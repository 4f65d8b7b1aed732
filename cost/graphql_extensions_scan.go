package cost

import "bytes"

// inserter is the streaming JSON rewriter of [ExtensionsWriter]: a
// push-based state machine fed the body in chunks cut anywhere. It follows
// the tokens of two objects only — the top-level one, and its
// "extensions" object — and skips every other value by counting brackets
// outside strings; it holds no byte but the upstream's own
// extensions.cost value while replacing it (at most maxHeldCost). Each
// chunk is handed on, with the object inserted or the held value
// replaced, before write returns.
type inserter struct {
	build   func(upstream []byte) []byte
	skipped func(reason string)

	phase    uint8
	depth    int
	inStr    bool
	esc      bool // the last byte of the previous chunk was an unpaired backslash in a string
	st       uint8
	inExt    bool // depth 2 is the top-level extensions object
	extSeen  bool
	members1 bool // the top-level object has a member
	members2 bool // the extensions object has one
	costSeen bool
	inserted bool

	capturing bool
	key       [16]byte
	keyLen    int // -1: longer than key, or escaped: no key of ours
	keyIs     uint8

	holding bool
	hold    []byte
}

// Phases of an inserter.
const (
	inStart  uint8 = iota // before the first byte of the document
	inObject              // in the top-level object
	inDone                // the rest passes as it comes
)

// States at a watched level (the top-level object, its extensions).
const (
	wKey   uint8 = iota // a key or '}'
	wColon              // ':'
	wValue              // a value
	wAfter              // ',' or '}' (or the rest of a number or literal)
)

// Keys of ours.
const (
	kOther uint8 = iota
	kExtensions
	kCost
)

func (s *inserter) giveUp(reason string) {
	s.phase = inDone
	if s.skipped != nil {
		s.skipped(reason)
	}
}

// write feeds p, handing out what goes to the client.
func (s *inserter) write(p []byte, out func([]byte)) {
	if s.phase == inDone && !s.holding {
		out(p)
		return
	}
	from, holdFrom := 0, 0
	i := 0
	for i < len(p) && s.phase != inDone {
		if s.inStr {
			start := i
			j := s.stringEnd(p, i)
			end := j
			if j < 0 {
				end = len(p)
			}
			if s.capturing {
				s.captureKey(p[start:end])
			}
			if j < 0 {
				i = len(p)
				break
			}
			s.inStr, i = false, j+1
			if s.capturing {
				s.capturing = false
				s.keyDone()
			}
			continue
		}
		c := p[i]
		if s.phase == inStart {
			switch {
			case isSpace(c):
			case c == '{':
				s.phase, s.depth, s.st = inObject, 1, wKey
			default:
				s.giveUp("the body is not a JSON object")
				continue
			}
			i++
			continue
		}
		if !(s.depth == 1 || s.depth == 2 && s.inExt) { // inside a value we only skip
			i = nextStructural(p, i)
			if i == len(p) {
				break
			}
			switch p[i] {
			case '"':
				s.inStr = true
			case '{', '[':
				s.depth++
			default: // '}', ']'
				s.depth--
				if s.depth == 1 || s.depth == 2 && s.inExt {
					s.st = wAfter
				}
			}
			i++
			continue
		}
		if isSpace(c) {
			i++
			continue
		}
		switch s.st {
		case wKey:
			switch c {
			case '"':
				s.inStr, s.capturing, s.keyLen, s.st = true, true, 0, wColon
				if s.depth == 1 {
					s.members1 = true
				} else {
					s.members2 = true
				}
			case '}':
				if s.depth == 1 && s.members1 || s.depth == 2 && s.members2 { // {"a":1,}
					s.giveUp("the body is not valid JSON")
					continue
				}
				from = s.close(p, i, from, out)
			default:
				s.giveUp("the body is not valid JSON")
				continue
			}
		case wColon:
			if c != ':' {
				s.giveUp("the body is not valid JSON")
				continue
			}
			s.st = wValue
		case wValue:
			if s.depth == 1 && s.keyIs == kExtensions && !s.extSeen {
				s.extSeen = true
				if c != '{' {
					s.giveUp("its extensions are not an object")
					continue
				}
				s.inExt, s.depth, s.st = true, 2, wKey
				i++
				continue
			}
			if s.depth == 2 && s.keyIs == kCost && !s.costSeen {
				// The upstream's own cost: held, to be replaced by ours.
				s.costSeen, s.holding = true, true
				out(p[from:i])
				holdFrom, s.hold = i, s.hold[:0]
			}
			s.st = wAfter
			switch c {
			case '"':
				s.inStr = true
			case '{', '[':
				s.depth++
			}
		case wAfter:
			switch c {
			case ',', '}':
				if s.holding {
					s.holding = false
					if len(s.hold)+i-holdFrom > maxHeldCost {
						out(s.hold)
						out(p[holdFrom:i])
						s.giveUp("the upstream's extensions.cost is longer than 4 KiB")
					} else {
						s.hold = append(s.hold, p[holdFrom:i]...)
						out(s.build(bytes.TrimSpace(s.hold)))
						s.inserted = true
					}
					from, s.hold = i, nil
					if s.phase == inDone {
						continue
					}
				}
				if c == ',' {
					s.st = wKey
				} else {
					from = s.close(p, i, from, out)
				}
			case ']', '{', '[', '"', ':':
				s.giveUp("the body is not valid JSON")
				continue
			}
			// anything else: the rest of a number or literal
		}
		i++
	}
	if s.holding {
		// Never more than maxHeldCost held, whatever the chunk's size.
		if len(s.hold)+len(p)-holdFrom > maxHeldCost || s.phase == inDone {
			out(s.hold)
			out(p[holdFrom:])
			s.holding, s.hold = false, nil
			if s.phase != inDone {
				s.giveUp("the upstream's extensions.cost is longer than 4 KiB")
			}
			return
		}
		s.hold = append(s.hold, p[holdFrom:]...)
		return
	}
	out(p[from:])
}

// close ends the watched object whose '}' is p[i], inserting the cost
// object before it when it is where the object goes; it returns from as
// it now is (the first byte not yet handed out).
func (s *inserter) close(p []byte, i, from int, out func([]byte)) int {
	if s.depth == 2 { // extensions
		s.inExt, s.depth, s.st = false, 1, wAfter
		if !s.costSeen && !s.inserted {
			out(p[from:i])
			b := make([]byte, 0, 256)
			if s.members2 {
				b = append(b, ',')
			}
			b = append(b, `"cost":`...)
			b = append(b, s.build(nil)...)
			out(b)
			s.inserted = true
			return i
		}
		return from
	}
	s.depth, s.phase = 0, inDone
	if !s.extSeen && !s.inserted {
		out(p[from:i])
		b := make([]byte, 0, 256)
		if s.members1 {
			b = append(b, ',')
		}
		b = append(b, `"extensions":{"cost":`...)
		b = append(b, s.build(nil)...)
		b = append(b, '}')
		out(b)
		s.inserted = true
		return i
	}
	return from
}

// finish ends the body: a value still held goes as it came.
func (s *inserter) finish(out func([]byte)) {
	if s.holding {
		out(s.hold)
		s.holding, s.hold = false, nil
	}
	if s.phase == inObject {
		s.giveUp("the body ended before its JSON object did")
	}
}

// stringEnd returns the index of the quote that ends the string p[i:] is
// in, or -1 when it does not end in p (s.esc then says whether p ended on
// an unpaired backslash).
func (s *inserter) stringEnd(p []byte, i int) int {
	if s.esc {
		s.esc = false
		i++
	}
	for i < len(p) {
		j := bytes.IndexByte(p[i:], '"')
		if j < 0 {
			s.esc = backslashes(p[i:])%2 == 1
			return -1
		}
		j += i
		if backslashes(p[i:j])%2 == 0 {
			return j
		}
		i = j + 1
	}
	return -1
}

// backslashes counts the backslashes that end b.
func backslashes(b []byte) int {
	n := 0
	for n < len(b) && b[len(b)-1-n] == '\\' {
		n++
	}
	return n
}

// nextStructural returns the index of the next quote or bracket of p at
// or after i, or len(p).
func nextStructural(p []byte, i int) int {
	for ; i < len(p); i++ {
		switch p[i] {
		case '"', '{', '}', '[', ']':
			return i
		}
	}
	return i
}

// captureKey takes the next bytes of a watched object's key. A key with
// an escape anywhere gives up, whatever its length and however the body
// was cut: it may spell extensions or cost (which could then be twice), and
// what the client gets must not depend on where the chunks end.
func (s *inserter) captureKey(b []byte) {
	if bytes.IndexByte(b, '\\') >= 0 {
		s.giveUp("a key of its is written with escapes")
		return
	}
	if s.keyLen < 0 {
		return
	}
	if s.keyLen+len(b) > len(s.key) {
		s.keyLen = -1
		return
	}
	s.keyLen += copy(s.key[s.keyLen:], b)
}

func (s *inserter) keyDone() {
	s.keyIs = kOther
	if s.keyLen < 0 {
		return
	}
	switch k := string(s.key[:s.keyLen]); {
	case s.depth == 1 && k == "extensions":
		s.keyIs = kExtensions
	case s.depth == 2 && k == "cost":
		s.keyIs = kCost
	}
}
