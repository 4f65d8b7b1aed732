package cost

import (
	"bytes"
	"fmt"
	"math"
	"unicode/utf16"
	"unicode/utf8"
)

// This file holds a small JSON cursor for request bodies held in memory.
//
// Why not encoding/json: the estimators need a handful of members out of
// bodies whose bulk is long strings (prompts, queries). Decoding those into Go
// values allocates and unescapes every string only to count its characters.
// The cursor walks the bytes once, validates the syntax, lets the caller pick
// members by key, and counts a string's code points straight from its escaped
// form without allocating. Nesting is bounded (maxJSONDepth) so hostile input
// cannot exhaust the stack.

// maxJSONDepth bounds the nesting of arrays and objects in a request body.
// Real chat and GraphQL bodies nest a dozen levels at most.
const maxJSONDepth = 128

// jsonSyntaxError reports malformed JSON and where.
type jsonSyntaxError struct {
	Offset int
	Msg    string
}

func (e *jsonSyntaxError) Error() string {
	return fmt.Sprintf("invalid JSON at byte %d: %s", e.Offset, e.Msg)
}

// jsonCursor reads one JSON document held in memory, front to back.
type jsonCursor struct {
	b     []byte
	i     int
	depth int
}

func (c *jsonCursor) fail(msg string) error {
	return &jsonSyntaxError{Offset: c.i, Msg: msg}
}

// ws skips whitespace.
func (c *jsonCursor) ws() {
	for c.i < len(c.b) {
		switch c.b[c.i] {
		case ' ', '\t', '\n', '\r':
			c.i++
		default:
			return
		}
	}
}

// peek returns the next non-space byte without consuming it (0 at the end).
func (c *jsonCursor) peek() byte {
	c.ws()
	if c.i >= len(c.b) {
		return 0
	}
	return c.b[c.i]
}

// end reports an error unless only whitespace remains.
func (c *jsonCursor) end() error {
	if c.peek() != 0 || c.i < len(c.b) {
		return c.fail("unexpected data after the top-level value")
	}
	return nil
}

func (c *jsonCursor) enter() error {
	if c.depth >= maxJSONDepth {
		return c.fail(fmt.Sprintf("nested deeper than %d levels", maxJSONDepth))
	}
	c.depth++
	return nil
}

// object reads an object, calling fn for each member with its key (unescaped).
// fn must consume the member's value (c.skip() when it is not wanted).
func (c *jsonCursor) object(fn func(key []byte) error) error {
	done, err := c.open('{', '}', "an object")
	for !done && err == nil {
		if c.peek() != '"' {
			return c.fail("expected a string key")
		}
		raw, esc, serr := c.str()
		if serr != nil {
			return serr
		}
		key := raw
		if esc {
			// Keys are matched after unescaping, as the upstream will read
			// them: "m\u0061x_tokens" is max_tokens. Rare, so it may allocate.
			key = unescapeJSON(nil, raw)
		}
		if c.peek() != ':' {
			return c.fail("expected ':' after an object key")
		}
		c.i++
		if ferr := fn(key); ferr != nil {
			return ferr
		}
		done, err = c.next('}', "an object")
	}
	return err
}

// array reads an array, calling fn for each element; fn must consume it.
func (c *jsonCursor) array(fn func() error) error {
	done, err := c.open('[', ']', "an array")
	for !done && err == nil {
		if c.peek() == 0 {
			return c.fail("unterminated array")
		}
		if ferr := fn(); ferr != nil {
			return ferr
		}
		done, err = c.next(']', "an array")
	}
	return err
}

// open enters a container (what: "an object", "an array") that starts with
// the byte opening; done reports that it closed at once, empty.
func (c *jsonCursor) open(opening, closing byte, what string) (done bool, err error) {
	if c.peek() != opening {
		return false, c.fail("expected " + what)
	}
	c.i++
	if err := c.enter(); err != nil {
		return false, err
	}
	if c.peek() == closing {
		c.i++
		c.depth--
		return true, nil
	}
	return false, nil
}

// next reads what follows a container's member: a comma, or the closing
// byte, which leaves the container (done).
func (c *jsonCursor) next(closing byte, what string) (done bool, err error) {
	switch c.peek() {
	case ',':
		c.i++
		return false, nil
	case closing:
		c.i++
		c.depth--
		return true, nil
	}
	return false, c.fail("expected ',' or '" + string(closing) + "' in " + what)
}

// str reads a string and returns its raw (still escaped) content and whether
// it holds any escape. Every byte is examined a bounded number of times, so a
// string full of escapes costs linear time.
func (c *jsonCursor) str() (raw []byte, escaped bool, err error) {
	if c.peek() != '"' {
		return nil, false, c.fail("expected a string")
	}
	b := c.b
	start := c.i + 1
	j := start
	for {
		q := bytes.IndexByte(b[j:], '"')
		if q < 0 {
			return nil, false, c.fail("unterminated string")
		}
		q += j
		for j <= q {
			k := bytes.IndexByte(b[j:q], '\\')
			if k < 0 {
				break
			}
			escaped = true
			p := j + k + 1
			if p >= len(b) {
				return nil, false, c.fail("unterminated escape")
			}
			switch b[p] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				j = p + 1
			case 'u':
				if p+4 >= len(b) || !isHex4(b[p+1:p+5]) {
					return nil, false, c.fail("invalid \\u escape")
				}
				j = p + 5
			default:
				return nil, false, c.fail("invalid escape")
			}
		}
		if j > q { // an escape consumed the quote: look further
			continue
		}
		c.i = q + 1
		return b[start:q], escaped, nil
	}
}

func isHex4(h []byte) bool {
	for _, x := range h {
		if !('0' <= x && x <= '9' || 'a' <= x && x <= 'f' || 'A' <= x && x <= 'F') {
			return false
		}
	}
	return true
}

// literal consumes the literal lit (true, false, null).
func (c *jsonCursor) literal(lit string) error {
	if len(c.b)-c.i < len(lit) || string(c.b[c.i:c.i+len(lit)]) != lit {
		return c.fail("invalid literal")
	}
	c.i += len(lit)
	return nil
}

// number reads a number. It returns its value when the number is an integer
// (saturated to the int64 range) and ok=false for fractions and exponents.
func (c *jsonCursor) number() (n int64, isInt bool, err error) {
	c.ws()
	b := c.b
	i := c.i
	neg := false
	if i < len(b) && b[i] == '-' {
		neg = true
		i++
	}
	if i >= len(b) || b[i] < '0' || b[i] > '9' {
		return 0, false, c.fail("invalid number")
	}
	isInt = true
	if b[i] == '0' {
		i++
	} else {
		for ; i < len(b) && '0' <= b[i] && b[i] <= '9'; i++ {
			n = satAdd(satMul(n, 10), int64(b[i]-'0'))
		}
	}
	if i < len(b) && b[i] == '.' {
		isInt = false
		i++
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			return 0, false, c.fail("invalid number")
		}
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		isInt = false
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			return 0, false, c.fail("invalid number")
		}
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
	}
	c.i = i
	if neg {
		n = -n
	}
	return n, isInt, nil
}

// skip consumes one value of any kind, validating it.
func (c *jsonCursor) skip() error {
	switch c.peek() {
	case '{':
		return c.object(func([]byte) error { return c.skip() })
	case '[':
		return c.array(func() error { return c.skip() })
	case '"':
		_, _, err := c.str()
		return err
	case 't':
		return c.literal("true")
	case 'f':
		return c.literal("false")
	case 'n':
		return c.literal("null")
	case 0:
		return c.fail("unexpected end of input")
	default:
		_, _, err := c.number()
		return err
	}
}

// span consumes one value and returns its raw bytes.
func (c *jsonCursor) span() ([]byte, error) {
	c.ws()
	start := c.i
	if err := c.skip(); err != nil {
		return nil, err
	}
	return c.b[start:c.i], nil
}

// sub returns a cursor over raw, a value previously returned by span, at the
// current depth so that nesting stays bounded overall.
func (c *jsonCursor) sub(raw []byte) *jsonCursor {
	return &jsonCursor{b: raw, depth: c.depth}
}

// countRunes counts the Unicode code points a JSON string stands for, from its
// raw escaped form: "\n" is one, a surrogate pair "\ud83d\ude00" is one.
func countRunes(raw []byte, escaped bool) int64 {
	if !escaped {
		return int64(utf8.RuneCount(raw))
	}
	var n int64
	for len(raw) > 0 {
		k := bytes.IndexByte(raw, '\\')
		if k < 0 {
			return n + int64(utf8.RuneCount(raw))
		}
		n += int64(utf8.RuneCount(raw[:k]))
		raw = raw[k:]
		if len(raw) >= 6 && raw[1] == 'u' {
			r := hexRune(raw[2:6])
			raw = raw[6:]
			// A high surrogate followed by a low one is a single code point.
			if utf16.IsSurrogate(r) && r < 0xdc00 && len(raw) >= 6 && raw[0] == '\\' && raw[1] == 'u' {
				if r2 := hexRune(raw[2:6]); r2 >= 0xdc00 && r2 <= 0xdfff {
					raw = raw[6:]
				}
			}
		} else {
			raw = raw[min(2, len(raw)):]
		}
		n++
	}
	return n
}

func hexRune(h []byte) rune {
	var r rune
	for _, x := range h {
		r <<= 4
		switch {
		case '0' <= x && x <= '9':
			r |= rune(x - '0')
		case 'a' <= x && x <= 'f':
			r |= rune(x - 'a' + 10)
		case 'A' <= x && x <= 'F':
			r |= rune(x - 'A' + 10)
		}
	}
	return r
}

// unescapeJSON appends the string raw stands for to dst. raw has been
// validated by str; lone surrogates become U+FFFD, as encoding/json does.
func unescapeJSON(dst, raw []byte) []byte {
	for len(raw) > 0 {
		k := bytes.IndexByte(raw, '\\')
		if k < 0 {
			return append(dst, raw...)
		}
		dst = append(dst, raw[:k]...)
		raw = raw[k:]
		if len(raw) < 2 {
			return dst
		}
		switch raw[1] {
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			if len(raw) < 6 {
				return dst
			}
			r := hexRune(raw[2:6])
			raw = raw[6:]
			if utf16.IsSurrogate(r) {
				if r < 0xdc00 && len(raw) >= 6 && raw[0] == '\\' && raw[1] == 'u' {
					if r2 := hexRune(raw[2:6]); r2 >= 0xdc00 && r2 <= 0xdfff {
						r = utf16.DecodeRune(r, r2)
						raw = raw[6:]
					} else {
						r = utf8.RuneError
					}
				} else {
					r = utf8.RuneError
				}
			}
			dst = utf8.AppendRune(dst, r)
			continue
		default: // '"', '\\', '/'
			dst = append(dst, raw[1])
		}
		raw = raw[2:]
	}
	return dst
}

// jsonString returns the Go string a raw JSON string stands for.
func jsonString(raw []byte, escaped bool) string {
	if !escaped {
		return string(raw)
	}
	return string(unescapeJSON(make([]byte, 0, len(raw)), raw))
}

// Saturating arithmetic on non-negative costs: a hostile `first: 1e18` nested
// three times must give "too expensive", not a negative number.

func satAdd(a, b int64) int64 {
	if s := a + b; (s > a) == (b > 0) {
		return s
	}
	if b > 0 {
		return math.MaxInt64
	}
	return math.MinInt64
}

func satMul(a, b int64) int64 {
	if a == 0 || b == 0 {
		return 0
	}
	if a < 0 || b < 0 {
		// Costs are never negative; treat as zero rather than reason about signs.
		return 0
	}
	if a > math.MaxInt64/b {
		return math.MaxInt64
	}
	return a * b
}
