package cost

import (
	"encoding/json"
	"errors"
	"math"
	"testing"
	"unicode/utf8"
)

// TestJSONStrings compares the cursor's string decoding and code point count
// with encoding/json's.
func TestJSONStrings(t *testing.T) {
	for _, lit := range []string{
		`""`, `"plain"`, `"tab\there"`, `"quote \" and \\ backslash"`, `"\/slash"`,
		`"\b\f\n\r\t"`, `"caf\u00e9"`, `"\u65e5\u672c"`, `"emoji \ud83d\ude00!"`,
		`"lone \ud83d surrogate"`, `"lone low \ude00"`, `"high then text \ud83dx"`,
		`"raw utf-8: 日本語 😀"`, `"\"\"\"\""`, `"\\\\\\"`,
	} {
		var want string
		if err := json.Unmarshal([]byte(lit), &want); err != nil {
			t.Fatalf("%s: %v", lit, err)
		}
		c := &jsonCursor{b: []byte(lit)}
		raw, esc, err := c.str()
		if err != nil {
			t.Fatalf("%s: %v", lit, err)
		}
		if got := jsonString(raw, esc); got != want {
			t.Errorf("%s: decoded %q, want %q", lit, got, want)
		}
		if got, want := countRunes(raw, esc), int64(utf8.RuneCountInString(want)); got != want {
			t.Errorf("%s: %d code points, want %d", lit, got, want)
		}
		if c.end() != nil {
			t.Errorf("%s: not fully consumed", lit)
		}
	}
	for _, bad := range []string{`"unterminated`, `"bad \x escape"`, `"\u12"`, `"\u12G4"`, `"ends with \`} {
		c := &jsonCursor{b: []byte(bad)}
		if _, _, err := c.str(); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

func TestJSONNumbers(t *testing.T) {
	tests := []struct {
		lit   string
		n     int64
		isInt bool
		bad   bool
	}{
		{"0", 0, true, false},
		{"-12", -12, true, false},
		{"4096", 4096, true, false},
		{"1.5", 1, false, false},
		{"2e3", 2, false, false},
		{"1E-2", 1, false, false},
		{"99999999999999999999999", math.MaxInt64, true, false},
		{"-", 0, false, true},
		{"1.", 0, false, true},
		{"1e", 0, false, true},
		{".5", 0, false, true},
	}
	for _, tt := range tests {
		c := &jsonCursor{b: []byte(tt.lit)}
		n, isInt, err := c.number()
		if (err != nil) != tt.bad {
			t.Errorf("%s: err %v", tt.lit, err)
			continue
		}
		if !tt.bad && (isInt != tt.isInt || (isInt && n != tt.n)) {
			t.Errorf("%s: %d %v, want %d %v", tt.lit, n, isInt, tt.n, tt.isInt)
		}
	}
}

func TestSaturatingArithmetic(t *testing.T) {
	if satAdd(math.MaxInt64, 1) != math.MaxInt64 || satAdd(math.MinInt64, -1) != math.MinInt64 || satAdd(2, 3) != 5 {
		t.Fatal("satAdd")
	}
	if satMul(math.MaxInt64/2, 3) != math.MaxInt64 || satMul(0, math.MaxInt64) != 0 || satMul(-1, 5) != 0 || satMul(6, 7) != 42 {
		t.Fatal("satMul")
	}
}

// TestJSONContainers checks skip over objects and arrays, and that each
// malformed container is refused with the message that says where.
func TestJSONContainers(t *testing.T) {
	tests := []struct {
		in   string
		want string // the error message, "" for none
	}{
		{`{}`, ""},
		{`[]`, ""},
		{` { "a" : [1, {"b": []}], "c": {} } `, ""},
		{`{"a":1 "b":2}`, "expected ',' or '}' in an object"},
		{`[1 2]`, "expected ',' or ']' in an array"},
		{`{"a":1,}`, "expected a string key"},
		{`{1:2}`, "expected a string key"},
		{`{"a" 1}`, "expected ':' after an object key"},
		{`[1,`, "unterminated array"},
		{`{"a":[1,2}`, "expected ',' or ']' in an array"},
	}
	for _, tt := range tests {
		c := &jsonCursor{b: []byte(tt.in)}
		err := c.skip()
		if err == nil {
			err = c.end()
		}
		var se *jsonSyntaxError
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: %v", tt.in, err)
		case tt.want != "" && (!errors.As(err, &se) || se.Msg != tt.want):
			t.Errorf("%s: error %v, want %q", tt.in, err, tt.want)
		}
		if tt.want == "" && c.depth != 0 {
			t.Errorf("%s: depth %d after the value, want 0", tt.in, c.depth)
		}
	}
}
