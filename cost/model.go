package cost

import (
	"bytes"
	"encoding/json"
	"errors"
	"unicode/utf8"
)

// maxModelName bounds the length of a model name Model returns; a longer
// "model" is not a name any price list holds.
const maxModelName = 256

// ModelOf returns the model a request body asks for: the top-level
// "model" member of a JSON object (where OpenAI Chat Completions, Responses
// and Completions and Anthropic Messages all put it), with escapes decoded,
// read as the upstream's decoder reads it: when the member appears twice
// the last one counts, and its name in another case ("Model") counts, as
// Go's decoder reads it. So a client cannot show one model to the price
// list and another to the provider.
//
// The name is "" when the body has no top-level "model" (one nested in
// messages, metadata or tools does not count), or when that member is not
// a string, is longer than 256 bytes, is not valid UTF-8 or holds an
// unescaped control character. The error says why a body that is not
// empty cannot be read: it is not a JSON object (its syntax checked as
// [LLM] checks it, strictly, except that control characters inside other
// strings pass; nested deeper than 128 levels), or it names its model in
// two cases ([ErrAmbiguousModel]: decoders disagree on which one wins).
//
// The body is read once, without decoding it into Go values; only the
// returned name is allocated.
func ModelOf(body []byte) (string, error) {
	name, _, _, err := model(body)
	if err != nil && len(bytes.TrimSpace(body)) > 0 {
		return "", err
	}
	return name, nil
}

// ReplaceModel returns body with the model it asks for (the member ModelOf
// reads) set to name, every other byte as it was; ok is false, and body
// is returned as is, when ModelOf finds no model in body.
func ReplaceModel(body []byte, name string) (_ []byte, ok bool) {
	old, start, end, _ := model(body)
	if old == "" {
		return body, false
	}
	quoted, _ := json.Marshal(name) // a string: cannot fail
	out := make([]byte, 0, len(body)-(end-start)+len(quoted))
	out = append(append(append(out, body[:start]...), quoted...), body[end:]...)
	return out, true
}

// ErrAmbiguousModel refuses a body that names its model twice, in
// different cases: a case-insensitive decoder (Go's) may read the one a
// case-sensitive one (Python's) does not.
var ErrAmbiguousModel = errors.New(`the body names its model twice, in different cases ("model" and "Model"): name it once`)

// model is ModelOf, with the offsets of the member's string in body (its
// quotes included), and why body could not be read. A member named
// "model" in another case counts (Go's decoder reads it), unless both
// are there.
func model(body []byte) (name string, start, end int, err error) {
	c := &jsonCursor{b: body}
	if c.peek() != '{' {
		return "", 0, 0, errors.New("the body is not a JSON object")
	}
	var raw []byte // the last top-level "model" string, still escaped
	var escaped, isString bool
	var spelled []byte // how the model's member was first spelled
	err = c.object(func(key []byte) error {
		if len(key) != len("model") || !bytes.EqualFold(key, []byte("model")) {
			return c.skip()
		}
		if spelled == nil {
			spelled = bytes.Clone(key)
		} else if !bytes.Equal(spelled, key) {
			return ErrAmbiguousModel
		}
		if c.peek() != '"' {
			isString = false
			return c.skip()
		}
		var serr error
		start = c.i
		raw, escaped, serr = c.str()
		end = c.i
		isString = true
		return serr
	})
	if err == nil {
		err = c.end()
	}
	if err != nil || !isString {
		return "", 0, 0, err
	}
	// Each decoded byte takes at most six raw ones (\u0041), so a raw form
	// this long decodes to more than the bound: no need to decode it.
	if len(raw) > maxModelName*6 {
		return "", 0, 0, nil
	}
	decoded := raw
	if escaped {
		decoded = unescapeJSON(make([]byte, 0, len(raw)), raw)
	}
	if len(decoded) > maxModelName || !utf8.Valid(decoded) || hasControl(raw) {
		return "", 0, 0, nil
	}
	return string(decoded), start, end, nil
}

// hasControl reports whether a raw JSON string holds a byte below 0x20,
// which JSON allows only escaped.
func hasControl(raw []byte) bool {
	for _, c := range raw {
		if c < 0x20 {
			return true
		}
	}
	return false
}
