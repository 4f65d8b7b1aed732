package cost

import "bytes"

// This file holds the response side parser: an incremental JSON scanner that
// picks usage numbers out of a stream of JSON documents, and an SSE framer
// that feeds it the data lines of an event stream.
//
// Approach: a push-based state machine with O(1) memory. Bytes are fed as
// the upstream writes them, in chunks cut anywhere, and the JSON scanner
// buffers none of them (the SSE framer holds at most one small event, see
// sseScanner, to skip content deltas cheaply). The scanner tracks object keys only along the few paths where usage lives
// (at most three levels below the root); every other value is skipped by
// counting brackets outside strings, with bytes.IndexByte/IndexAny doing the
// scanning. So a 1 MiB completion costs one pass over its bytes and no
// allocation, and a usage object anywhere in the document (first or last
// member, any order) is found. Limits: keys longer than 32 bytes or written
// with escapes are never usage keys (no real upstream escapes ASCII keys);
// numbers with exponents are ignored; the scanner checks structure, not full
// JSON validity — it reads trusted upstream output and only has to be safe
// on garbage, not to diagnose it. A document's numbers count only once the
// document has ended, so a stream cut in the middle of a usage object
// reports nothing rather than a half-read number.

// Nodes: the objects along the paths where usage lives.
const (
	nodeNone       uint8 = iota
	nodeRoot             // the document
	nodeResponse         // root.response (OpenAI Responses stream events)
	nodeMessage          // root.message (Anthropic message_start)
	nodeExtensions       // root.extensions (GraphQL)
	nodeUsageFinal       // root.usage, root.response.usage
	nodeUsageStart       // root.message.usage: provisional, not final
	nodeCost             // root.extensions.cost
	nodeDetails          // {root,root.response}.usage.{prompt,input}_tokens_details (OpenAI)
)

// Usage fields.
const (
	fPromptTokens = iota
	fCompletionTokens
	fTotalTokens
	fInputTokens
	fOutputTokens
	fCacheCreation
	fCacheRead
	fCachedTokens // OpenAI's cached_tokens, part of prompt_tokens or input_tokens
	fGQLActual
	fGQLRequested
	fGQLCost // extensions.cost given as a bare number
	nFields
)

// Scanner states.
const (
	sBetween     uint8 = iota // between documents
	sKey                      // in an object, expecting a key or '}'
	sInKey                    // reading a key
	sColon                    // expecting ':'
	sValue                    // expecting a value
	sAfterValue               // expecting ',' or '}'
	sNumber                   // reading a wanted number
	sSkipPrim                 // skipping a number or literal
	sSkipStr                  // skipping a string value
	sSkipStrEsc               // just after a backslash in a skipped string
	sSkipNest                 // skipping an array or object
	sSkipNestStr              // in a string inside a skipped array or object
	sSkipNestEsc              // after a backslash there
	sDead                     // gave up on this document
)

const (
	maxFrames = 4 // root + response/message/extensions + usage/cost + usage details
	maxKey    = 32
)

// usageScanner scans a stream of JSON documents for usage reports.
type usageScanner struct {
	prov provMask // which providers' paths count
	gql  bool     // extensions.cost counts

	// Committed: the last value of each field over completed documents.
	vals      [nFields]int64
	seen      uint16 // fields ever committed
	lastTotal bool   // the last document with usage had a total
	found     bool   // a final report was committed

	// The document being read.
	state     uint8
	resume    uint8 // state after a skip ends
	frames    [maxFrames]uint8
	nframes   int
	key       [maxKey]byte
	keyLen    int // -1: the key cannot matter
	field     int // field of the number being read, -1 if none
	num       int64
	numNeg    bool
	numFrac   bool
	numBad    bool
	skipDepth int
	pending   [nFields]int64
	pseen     uint16
	pfinal    bool
}

func newUsageScanner(provider string) *usageScanner {
	s := &usageScanner{}
	switch provider {
	case ProviderOpenAI:
		s.prov = provOpenAI
	case ProviderAnthropic:
		s.prov = provAnthropic
	case ProviderGraphQL:
		s.gql = true
	default:
		s.prov, s.gql = provOpenAI|provAnthropic, true
	}
	return s
}

// reset abandons the current document.
func (s *usageScanner) reset() {
	s.state = sBetween
	s.nframes = 0
	s.pseen = 0
	s.pfinal = false
}

// endDocument commits the document's numbers: the last value seen wins,
// field by field (Anthropic's message_delta carries cumulative counts that
// replace message_start's; nothing is ever summed).
func (s *usageScanner) endDocument() {
	if s.pseen != 0 {
		for f := 0; f < nFields; f++ {
			if s.pseen&(1<<f) != 0 {
				s.vals[f] = s.pending[f]
			}
		}
		s.seen |= s.pseen
		s.lastTotal = s.pseen&(1<<fTotalTokens) != 0
		if s.pfinal {
			s.found = true
		}
	}
	s.reset()
}

// usage returns what the committed documents reported.
func (s *usageScanner) usage() Usage {
	has := func(f int) bool { return s.seen&(1<<f) != 0 }
	var u Usage
	if !s.found {
		return u
	}
	if has(fInputTokens) || has(fPromptTokens) || has(fOutputTokens) || has(fCompletionTokens) || has(fTotalTokens) {
		u.Input = s.vals[fPromptTokens]
		if has(fInputTokens) {
			u.Input = s.vals[fInputTokens]
		}
		u.Input = satAdd(u.Input, satAdd(s.vals[fCacheCreation], s.vals[fCacheRead]))
		// Anthropic's cache reads are added to Input above; OpenAI's cached
		// tokens are already inside it. A provider reports one or the other.
		u.CachedInput = min(satAdd(s.vals[fCacheRead], s.vals[fCachedTokens]), u.Input)
		u.CacheWrite = min(s.vals[fCacheCreation], u.Input-u.CachedInput)
		u.Output = s.vals[fCompletionTokens]
		if has(fOutputTokens) {
			u.Output = s.vals[fOutputTokens]
		}
		u.Total = satAdd(u.Input, u.Output)
		if s.lastTotal {
			u.Total = s.vals[fTotalTokens]
		}
		u.Found = true
		return u
	}
	switch {
	case has(fGQLActual):
		u.Total = s.vals[fGQLActual]
	case has(fGQLRequested):
		u.Total = s.vals[fGQLRequested]
	case has(fGQLCost):
		u.Total = s.vals[fGQLCost]
	default:
		return u
	}
	u.Found = true
	return u
}

func (s *usageScanner) top() uint8 { return s.frames[s.nframes-1] }

// child returns the node a key leads to from the current frame when its
// value is an object.
func (s *usageScanner) child() uint8 {
	k := s.key[:max(s.keyLen, 0)]
	switch s.top() {
	case nodeRoot:
		switch string(k) {
		case "usage":
			if s.prov != 0 {
				return nodeUsageFinal
			}
		case "response":
			if s.prov&provOpenAI != 0 {
				return nodeResponse
			}
		case "message":
			if s.prov&provAnthropic != 0 {
				return nodeMessage
			}
		case "extensions":
			if s.gql {
				return nodeExtensions
			}
		}
	case nodeResponse:
		if string(k) == "usage" {
			return nodeUsageFinal
		}
	case nodeUsageFinal:
		// Chat Completions' prompt_tokens_details, the Responses API's
		// input_tokens_details: where OpenAI counts cached input.
		switch string(k) {
		case "prompt_tokens_details", "input_tokens_details":
			if s.prov&provOpenAI != 0 {
				return nodeDetails
			}
		}
	case nodeMessage:
		if string(k) == "usage" {
			return nodeUsageStart
		}
	case nodeExtensions:
		if string(k) == "cost" {
			return nodeCost
		}
	}
	return nodeNone
}

// numberField returns the field a key names when its value is a number.
func (s *usageScanner) numberField() int {
	k := s.key[:max(s.keyLen, 0)]
	switch s.top() {
	case nodeUsageFinal, nodeUsageStart:
		oa, an := s.prov&provOpenAI != 0, s.prov&provAnthropic != 0
		switch string(k) {
		case "prompt_tokens":
			if oa {
				return fPromptTokens
			}
		case "completion_tokens":
			if oa {
				return fCompletionTokens
			}
		case "total_tokens":
			if oa {
				return fTotalTokens
			}
		case "input_tokens":
			return fInputTokens
		case "output_tokens":
			return fOutputTokens
		case "cache_creation_input_tokens":
			if an {
				return fCacheCreation
			}
		case "cache_read_input_tokens":
			if an {
				return fCacheRead
			}
		}
	case nodeDetails:
		if string(k) == "cached_tokens" {
			return fCachedTokens
		}
	case nodeCost:
		switch string(k) {
		case "actualQueryCost":
			return fGQLActual
		case "requestedQueryCost":
			return fGQLRequested
		}
	case nodeExtensions:
		if string(k) == "cost" {
			return fGQLCost
		}
	}
	return -1
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// write feeds the next bytes of the stream.
func (s *usageScanner) write(p []byte) {
	for i := 0; i < len(p); {
		c := p[i]
		switch s.state {
		case sBetween:
			if isSpace(c) {
				i++
				continue
			}
			s.pseen, s.pfinal = 0, false
			switch c {
			case ',', ':', '}', ']':
				// Stray punctuation between documents: not a value.
				i++
				continue
			}
			if c == '{' {
				s.frames[0], s.nframes = nodeRoot, 1
				s.state = sKey
				i++
				continue
			}
			// A document that is not an object holds no usage: skip it.
			s.nframes = 0
			s.resume = sBetween
			s.startSkip(c)
			if s.state == sSkipPrim {
				continue // reprocess c as part of the primitive
			}
			i++

		case sKey:
			switch {
			case isSpace(c):
			case c == '"':
				s.keyLen = 0
				s.state = sInKey
			case c == '}':
				s.pop()
			default:
				s.state = sDead
			}
			i++

		case sInKey:
			end := len(p)
			q := bytes.IndexByte(p[i:], '"')
			if q >= 0 {
				end = i + q
			}
			if bytes.IndexByte(p[i:end], '\\') >= 0 {
				// An escaped key is never a usage key: skip the rest of it
				// as a string, then expect the colon.
				s.keyLen = -1
				s.state = sSkipStr
				s.resume = sColon
				continue
			}
			if seg := p[i:end]; s.keyLen >= 0 {
				if s.keyLen+len(seg) > maxKey {
					s.keyLen = -1
				} else {
					s.keyLen += copy(s.key[s.keyLen:], seg)
				}
			}
			if q < 0 {
				i = len(p)
				continue
			}
			s.state = sColon
			i = end + 1

		case sColon:
			switch {
			case isSpace(c):
			case c == ':':
				s.state = sValue
			default:
				s.state = sDead
			}
			i++

		case sValue:
			if isSpace(c) {
				i++
				continue
			}
			s.resume = sAfterValue
			switch {
			case c == '{':
				if n := s.child(); n != nodeNone && s.nframes < maxFrames {
					s.frames[s.nframes] = n
					s.nframes++
					s.state = sKey
					i++
					continue
				}
			case c == '-' || ('0' <= c && c <= '9'):
				if f := s.numberField(); f >= 0 {
					s.field = f
					s.num, s.numNeg, s.numFrac, s.numBad = 0, false, false, false
					s.state = sNumber
					continue // reprocess c
				}
			}
			s.startSkip(c)
			if s.state == sSkipPrim {
				continue
			}
			i++

		case sNumber:
			switch {
			case '0' <= c && c <= '9':
				if !s.numFrac {
					s.num = satAdd(satMul(s.num, 10), int64(c-'0'))
				}
			case c == '-' && s.num == 0 && !s.numNeg:
				s.numNeg = true
			case c == '.':
				s.numFrac = true
			case c == 'e' || c == 'E' || c == '+':
				s.numBad = true
			default:
				if !s.numBad {
					v := s.num
					if s.numNeg {
						v = 0
					}
					s.pending[s.field] = v
					s.pseen |= 1 << s.field
					if s.top() != nodeUsageStart {
						s.pfinal = true
					}
				}
				s.state = sAfterValue
				continue // reprocess the delimiter
			}
			i++

		case sAfterValue:
			switch {
			case isSpace(c):
			case c == ',':
				s.state = sKey
			case c == '}':
				s.pop()
			default:
				s.state = sDead
			}
			i++

		case sSkipPrim:
			if c == ',' || c == '}' || c == ']' || isSpace(c) {
				s.endSkip()
				continue
			}
			if c == '{' || c == '[' || c == '"' {
				s.state = sDead
			}
			i++

		case sSkipStr, sSkipNestStr:
			// Find the next quote once, then hop over the escapes before
			// it; search again only when an escape consumed that quote.
			// Each byte is looked at a bounded number of times, however
			// many escapes a string holds.
			end := len(p)
			q := bytes.IndexByte(p[i:], '"')
			if q >= 0 {
				end = i + q
			}
			for {
				k := bytes.IndexByte(p[i:end], '\\')
				if k < 0 {
					break
				}
				i += k + 2 // the backslash and the character it escapes
				if i > end {
					break
				}
			}
			if i > len(p) { // the chunk ended on a backslash
				if s.state == sSkipStr {
					s.state = sSkipStrEsc
				} else {
					s.state = sSkipNestEsc
				}
				i = len(p)
				continue
			}
			if i > end || q < 0 { // the quote was escaped, or none in this chunk
				if q < 0 {
					i = len(p)
				}
				continue
			}
			i = end + 1
			if s.state == sSkipStr {
				s.endSkip()
			} else {
				s.state = sSkipNest
			}

		case sSkipStrEsc:
			s.state = sSkipStr
			i++
		case sSkipNestEsc:
			s.state = sSkipNestStr
			i++

		case sSkipNest:
			j := bytes.IndexAny(p[i:], "\"{}[]")
			if j < 0 {
				i = len(p)
				continue
			}
			i += j
			switch p[i] {
			case '"':
				s.state = sSkipNestStr
			case '{', '[':
				s.skipDepth++
			default:
				s.skipDepth--
				if s.skipDepth == 0 {
					s.endSkip()
				}
			}
			i++

		case sDead:
			return
		}
	}
}

// startSkip begins skipping the value starting with c.
func (s *usageScanner) startSkip(c byte) {
	switch c {
	case '{', '[':
		s.skipDepth = 1
		s.state = sSkipNest
	case '"':
		s.state = sSkipStr
	default:
		s.state = sSkipPrim
	}
}

// endSkip finishes a skipped value.
func (s *usageScanner) endSkip() {
	if s.resume == sBetween || s.nframes == 0 {
		s.reset()
		return
	}
	s.state = s.resume
}

// pop closes the current object; closing the root ends the document.
func (s *usageScanner) pop() {
	s.nframes--
	if s.nframes == 0 {
		s.endDocument()
		return
	}
	s.state = sAfterValue
}

// sseScanner frames a text/event-stream and feeds each event's data to a
// usageScanner, one JSON document per event.
//
// Most events of a stream are small content deltas that cannot hold a
// report, and running the JSON state machine over each costs more than the
// rest of the proxying. So an event's data is first gathered in a small
// bounded buffer (sseBuffer bytes) and, when the event ends, handed to the
// JSON scanner only if it mentions a member that can carry a report
// ("usage", or "extensions" for GraphQL): one vectorised search per event.
// Escaped key spellings are never reports (see usageScanner), so the filter
// loses nothing. An event larger than the buffer (the Responses API's
// response.completed carries the whole output) switches to streaming: the
// buffered prefix and then every further byte go straight to the scanner,
// so memory stays bounded whatever the event's size.
type sseScanner struct {
	js        *usageScanner
	state     uint8
	name      [8]byte
	nlen      int
	lastCR    bool
	buf       []byte // the current event's data, up to sseBuffer bytes
	streaming bool   // the current event outgrew buf and is being streamed
}

// sseBuffer bounds the data of one event gathered before filtering.
const sseBuffer = 4 << 10

func newSSEScanner(js *usageScanner) sseScanner {
	return sseScanner{js: js, buf: make([]byte, 0, sseBuffer)}
}

const (
	lineStart uint8 = iota
	lineField
	lineDataSpace
	lineData
	lineSkip
)

func (s *sseScanner) write(p []byte) {
	for i := 0; i < len(p); {
		c := p[i]
		if s.lastCR {
			s.lastCR = false
			if c == '\n' { // the LF of a CRLF
				i++
				continue
			}
		}
		switch s.state {
		case lineStart:
			switch c {
			case '\r', '\n':
				s.lastCR = c == '\r'
				s.dispatch()
				i++
				continue
			case ':': // a comment
				s.state = lineSkip
				i++
				continue
			}
			s.nlen = 0
			s.state = lineField
		case lineField:
			switch c {
			case ':':
				if string(s.name[:s.nlen]) == "data" {
					s.state = lineDataSpace
				} else {
					s.state = lineSkip
				}
			case '\r', '\n':
				s.lastCR = c == '\r'
				s.state = lineStart
			default:
				if s.nlen < len(s.name) {
					s.name[s.nlen] = c
				}
				s.nlen++
				if s.nlen > len(s.name) {
					s.state = lineSkip
				}
			}
			i++
		case lineDataSpace:
			s.state = lineData
			if c == ' ' {
				i++
			}
		case lineData:
			j := indexEOL(p[i:])
			if j < 0 {
				s.feed(p[i:])
				i = len(p)
				continue
			}
			s.feed(p[i : i+j])
			s.feed([]byte{'\n'}) // lines of one event's data join with LF
			s.lastCR = p[i+j] == '\r'
			s.state = lineStart
			i += j + 1
		case lineSkip:
			j := indexEOL(p[i:])
			if j < 0 {
				i = len(p)
				continue
			}
			s.lastCR = p[i+j] == '\r'
			s.state = lineStart
			i += j + 1
		}
	}
}

func (s *sseScanner) feed(p []byte) {
	if s.streaming {
		s.js.write(p)
		return
	}
	if len(s.buf)+len(p) <= cap(s.buf) {
		s.buf = append(s.buf, p...)
		return
	}
	s.streaming = true
	s.js.write(s.buf)
	s.buf = s.buf[:0]
	s.js.write(p)
}

// dispatch ends an event: its document is complete (and committed) or
// dropped.
func (s *sseScanner) dispatch() {
	if !s.streaming && len(s.buf) > 0 && s.mayReport(s.buf) {
		s.js.write(s.buf)
	}
	s.buf = s.buf[:0]
	s.streaming = false
	s.js.reset()
}

// finish handles a stream that ended without the blank line closing its
// last event: the SSE specification discards such an event, but a complete
// JSON document in it is still the upstream's report, so it is read.
func (s *sseScanner) finish() {
	if !s.streaming && len(s.buf) > 0 && s.mayReport(s.buf) {
		s.js.write(s.buf)
	}
	s.buf = s.buf[:0]
}

// mayReport is the cheap filter: could this event hold a report? A report
// is an object value of "usage" (or "extensions"), so the filter visits each
// '{' — a handful per event, found by vectorised search — and looks back
// for `"usage":`. The "usage":null of every OpenAI content chunk, and the
// word usage in generated text, do not count.
func (s *sseScanner) mayReport(data []byte) bool {
	usage, ext := s.js.prov != 0, s.js.gql
	for i := 0; ; i++ {
		k := bytes.IndexByte(data[i:], '{')
		if k < 0 {
			return false
		}
		i += k
		j := i - 1
		for j >= 0 && isSpace(data[j]) {
			j--
		}
		if j < 0 || data[j] != ':' {
			continue
		}
		j--
		for j >= 0 && isSpace(data[j]) {
			j--
		}
		if usage && hasSuffix(data[:j+1], `"usage"`) || ext && hasSuffix(data[:j+1], `"extensions"`) {
			return true
		}
	}
}

func hasSuffix(b []byte, s string) bool {
	return len(b) >= len(s) && string(b[len(b)-len(s):]) == s
}

// indexEOL returns the index of the first CR or LF in p, or -1. Two
// vectorised IndexByte passes beat one byte-at-a-time loop on long lines.
func indexEOL(p []byte) int {
	n := bytes.IndexByte(p, '\n')
	if n < 0 {
		n = len(p)
	}
	if r := bytes.IndexByte(p[:n], '\r'); r >= 0 {
		return r
	}
	if n == len(p) {
		return -1
	}
	return n
}
