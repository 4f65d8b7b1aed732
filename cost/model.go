package cost

import (
	"encoding/json"
	"unicode/utf8"
)

// maxModelName bounds the length of a model name Model returns; a longer
// "model" is not a name any price list holds.
const maxModelName = 256

// Model returns the model a request body asks for: the top-level "model"
// member of a JSON object (where OpenAI Chat Completions, Responses and
// Completions and Anthropic Messages all put it), with escapes decoded.
//
// It returns "" when the body is not a JSON object (or nests deeper than
// the package's bound of 128 levels), when it has no top-level "model", or
// when that member is not a string, is longer than 256 bytes, or is not
// valid UTF-8 or holds an unescaped control character. The body's syntax is
// checked as [LLM] checks it: strictly, except that control characters
// inside other strings pass (the upstream rejects such a body anyway). A "model" nested anywhere else (in messages,
// metadata, tools) does not count. When the member appears twice the last
// one counts, as it does for the upstream's JSON decoder, so a client cannot
// show one model to the price list and another to the provider.
//
// The body is read once, without decoding it into Go values; only the
// returned name is allocated.
func Model(body []byte) string {
	name, _, _ := model(body)
	return name
}

// ReplaceModel returns body with the model it asks for (the member Model
// reads) set to name, every other byte as it was; ok is false, and body
// is returned as is, when Model finds no model in body.
func ReplaceModel(body []byte, name string) (_ []byte, ok bool) {
	old, start, end := model(body)
	if old == "" {
		return body, false
	}
	quoted, _ := json.Marshal(name) // a string: cannot fail
	out := make([]byte, 0, len(body)-(end-start)+len(quoted))
	out = append(append(append(out, body[:start]...), quoted...), body[end:]...)
	return out, true
}

// model is Model, with the offsets of the member's string in body (its
// quotes included).
func model(body []byte) (name string, start, end int) {
	c := &jsonCursor{b: body}
	if c.peek() != '{' {
		return "", 0, 0
	}
	var raw []byte // the last top-level "model" string, still escaped
	var escaped, isString bool
	err := c.object(func(key []byte) error {
		if string(key) != "model" {
			return c.skip()
		}
		if c.peek() != '"' {
			isString = false
			return c.skip()
		}
		var err error
		start = c.i
		raw, escaped, err = c.str()
		end = c.i
		isString = true
		return err
	})
	if err != nil || c.end() != nil || !isString {
		return "", 0, 0
	}
	// Each decoded byte takes at most six raw ones (\u0041), so a raw form
	// this long decodes to more than the bound: no need to decode it.
	if len(raw) > maxModelName*6 {
		return "", 0, 0
	}
	decoded := raw
	if escaped {
		decoded = unescapeJSON(make([]byte, 0, len(raw)), raw)
	}
	if len(decoded) > maxModelName || !utf8.Valid(decoded) || hasControl(raw) {
		return "", 0, 0
	}
	return string(decoded), start, end
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
