package cost

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"unicode/utf8"
)

// Providers understood by [LLM] and [TapConfig].
const (
	ProviderAuto      = "auto"
	ProviderOpenAI    = "openai"
	ProviderAnthropic = "anthropic"
	ProviderGraphQL   = "graphql" // TapConfig only
)

// Defaults of [LLM].
const (
	DefaultCharsPerToken   = 4
	DefaultMaxOutputTokens = 4096
	DefaultImageTokens     = 1000
	DefaultLLMMaxBodyBytes = 8 << 20
)

// Tokenizer counts the tokens of a text. The default is the characters/4
// heuristic ([CharTokenizer]); an exact tokenizer for a model family can
// replace it through [LLM.Tokenizer].
type Tokenizer interface {
	Count(text string) int64
}

// CharTokenizer is the heuristic tokenizer: one token per CharsPerToken
// Unicode code points, rounded up. Four characters per token is OpenAI's and
// Anthropic's own rule of thumb for English; code and non-Latin scripts use
// more tokens per character, so lower it (say 3) to be conservative.
type CharTokenizer struct {
	CharsPerToken float64
}

// Count returns ceil(code points / CharsPerToken).
func (t CharTokenizer) Count(text string) int64 {
	return ceilDiv(int64(utf8.RuneCountInString(text)), t.CharsPerToken)
}

func ceilDiv(chars int64, per float64) int64 {
	if per <= 0 {
		per = DefaultCharsPerToken
	}
	if chars <= 0 {
		return 0
	}
	v := math.Ceil(float64(chars) / per)
	if v >= math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(v)
}

// LLM estimates the tokens an LLM API call will consume: the input tokens of
// the prompt plus the most output tokens the call may produce.
//
//	estimate = ceil(input characters / CharsPerToken)
//	         + ImageTokens × (non-text content parts)
//	         + max output tokens × n
//
// It reads OpenAI Chat Completions (messages, with string or array content,
// all roles including system and developer; tool calls), the OpenAI
// Responses API (instructions, input as a string or an array of items), the
// legacy Completions prompt, and Anthropic Messages (system as a string or
// text blocks; messages with string or block content; tool_use and
// tool_result). Tool definitions and response schemas count too, by the
// characters of their JSON, since the provider puts them in the prompt.
//
// Characters are Unicode code points of the decoded strings ("é" is one,
// "\n" is one, an emoji is one), not bytes and not UTF-16 units.
//
// Content parts are counted by type: text parts by their text; images,
// audio, files and documents at the flat ImageTokens each (base64 data is
// not text); tool calls by their name and arguments; tool results by their
// content, recursively; any part of an unknown type by the characters of
// its JSON text, so that nothing the provider might read passes free.
//
// The max output is the largest of max_tokens, max_completion_tokens and
// max_output_tokens present, or DefaultMaxTokens when none is, times n (the
// number of OpenAI choices) when n > 1.
//
// An empty body costs 0 (no LLM call can run without one). A body longer
// than MaxBodyBytes is a 413. Malformed JSON is a 400, or DefaultCost when
// OnMalformed is "default" (reported by EstimateUsage as DefaultCost input,
// output and total, so that every [Actual] mode charges it). Members of
// unexpected types are ignored: the provider rejects such a request without
// using tokens.
type LLM struct {
	// Provider selects which request members are read: "openai",
	// "anthropic", or "auto" (default) for the union of both, which is safe
	// because their member names do not collide in meaning.
	Provider string `json:"provider,omitempty"`
	// CharsPerToken is the heuristic's characters per token (default 4).
	CharsPerToken float64 `json:"chars_per_token,omitempty"`
	// DefaultMaxTokens is the output budget assumed when the request sets
	// none of max_tokens, max_completion_tokens, max_output_tokens (default
	// 4096, a common ceiling; OpenAI's own default is the model's whole
	// output window, so set it to your models' limit to be exact).
	DefaultMaxTokens int64 `json:"default_max_tokens,omitempty"`
	// ImageTokens is the flat cost of each non-text content part: image,
	// audio, file or document (default 1000; a 1024×1024 image costs about
	// 765 tokens at OpenAI and 1,400 at Anthropic).
	ImageTokens int64 `json:"image_tokens,omitempty"`
	// MaxBodyBytes bounds the body read to estimate (default 8 MiB). A
	// longer body is answered with 413.
	MaxBodyBytes int64 `json:"max_body_bytes,omitempty"`
	// OnMalformed is "reject" (default: a 400 problem) or "default" (charge
	// DefaultCost and let the upstream answer).
	OnMalformed string `json:"on_malformed,omitempty"`
	// DefaultCost is charged for malformed input when OnMalformed is
	// "default"; it must then be positive.
	DefaultCost int64 `json:"default_cost,omitempty"`

	// Tokenizer replaces the characters/CharsPerToken heuristic. It is
	// called once per text segment (a message's text, a tool's JSON), so
	// the total is the sum of the segments' counts.
	Tokenizer Tokenizer `json:"-"`
}

// Provision applies defaults and validates the configuration.
func (l *LLM) Provision() error {
	if l.Provider == "" {
		l.Provider = ProviderAuto
	}
	if l.CharsPerToken == 0 {
		l.CharsPerToken = DefaultCharsPerToken
	}
	if l.DefaultMaxTokens == 0 {
		l.DefaultMaxTokens = DefaultMaxOutputTokens
	}
	if l.ImageTokens == 0 {
		l.ImageTokens = DefaultImageTokens
	}
	if l.MaxBodyBytes == 0 {
		l.MaxBodyBytes = DefaultLLMMaxBodyBytes
	}
	if l.OnMalformed == "" {
		l.OnMalformed = OnMalformedReject
	}
	return l.Validate()
}

// Validate rejects bad values. Zero values mean "the default".
func (l *LLM) Validate() error {
	switch l.Provider {
	case "", ProviderAuto, ProviderOpenAI, ProviderAnthropic:
	default:
		return fmt.Errorf(`llm: provider must be "auto", "openai" or "anthropic", got %q`, l.Provider)
	}
	if l.CharsPerToken < 0 || math.IsNaN(l.CharsPerToken) || math.IsInf(l.CharsPerToken, 0) {
		return fmt.Errorf("llm: chars_per_token must be positive, got %v", l.CharsPerToken)
	}
	if l.DefaultMaxTokens < 0 {
		return fmt.Errorf("llm: default_max_tokens must not be negative, got %d", l.DefaultMaxTokens)
	}
	if l.ImageTokens < 0 {
		return fmt.Errorf("llm: image_tokens must not be negative, got %d", l.ImageTokens)
	}
	if l.MaxBodyBytes < 0 {
		return fmt.Errorf("llm: max_body_bytes must not be negative, got %d", l.MaxBodyBytes)
	}
	if l.OnMalformed != "" {
		if err := validateOnMalformed(l.OnMalformed, l.DefaultCost); err != nil {
			return fmt.Errorf("llm: %w", err)
		}
	}
	return nil
}

// NeedsBody returns true.
func (l *LLM) NeedsBody() bool { return true }

// BodyLimit returns MaxBodyBytes (or its default).
func (l *LLM) BodyLimit() int64 { return orDefault(l.MaxBodyBytes, DefaultLLMMaxBodyBytes) }

// Estimate returns the estimated input plus maximum output tokens.
func (l *LLM) Estimate(req *Request) (int64, error) {
	u, err := l.EstimateUsage(req)
	return u.Total, err
}

// EstimateUsage returns the estimate split into input and output tokens, in
// the same shape as the actual usage read from the response, so that one
// [Actual] can weigh both the same way. Found is true on success.
func (l *LLM) EstimateUsage(req *Request) (Usage, error) {
	// The body may have been read further for another estimator: this
	// one's limit holds all the same.
	if req.Truncated || int64(len(req.Body)) > l.BodyLimit() {
		return Usage{}, tooLarge(l.BodyLimit())
	}
	body := req.Body
	if len(bytes.TrimSpace(body)) == 0 {
		return Usage{Found: true}, nil
	}
	w := llmWalk{l: l, tok: l.Tokenizer, prov: providerMask(l.Provider)}
	in, out, err := w.run(body)
	if err != nil {
		var se *jsonSyntaxError
		if !errors.As(err, &se) {
			return Usage{}, err
		}
		if l.OnMalformed == OnMalformedDefault {
			// The split is unknown: report DefaultCost on each side so that
			// any Actual mode (input, output, weighted) charges at least it.
			d := l.DefaultCost
			return Usage{Input: d, Output: d, Total: d, Found: true}, nil
		}
		return Usage{}, &InputError{
			Status: 400,
			Type:   TypeMalformedJSON,
			Title:  "Malformed JSON request body",
			Detail: se.Error(),
			Err:    err,
		}
	}
	return Usage{Input: in, Output: out, Total: satAdd(in, out), Found: true}, nil
}

func orDefault(v, def int64) int64 {
	if v == 0 {
		return def
	}
	return v
}

type provMask uint8

const (
	provOpenAI provMask = 1 << iota
	provAnthropic
)

func providerMask(p string) provMask {
	switch p {
	case ProviderOpenAI:
		return provOpenAI
	case ProviderAnthropic:
		return provAnthropic
	}
	return provOpenAI | provAnthropic
}

// llmWalk accumulates one request's counts.
type llmWalk struct {
	l      *LLM
	tok    Tokenizer
	prov   provMask
	chars  int64 // code points, when tok is nil
	tokens int64 // tokens counted by tok
	media  int64 // non-text parts
	nested int   // content parts being read inside other parts
}

// maxPartNesting bounds how deep content parts are read as parts (a tool
// result's content is one level; real requests use two or three). A part
// notes where its members are before reading them, so each level reads its
// bytes once more: deeper content counts as its raw JSON text instead (an
// overestimate), which keeps a hostile body linear in its size.
const maxPartNesting = 4

func (w *llmWalk) run(body []byte) (in, out int64, err error) {
	c := &jsonCursor{b: body}
	if c.peek() != '{' {
		return 0, 0, c.fail("the request body must be a JSON object")
	}
	maxOut, n := int64(-1), int64(1)
	oa, an := w.prov&provOpenAI != 0, w.prov&provAnthropic != 0
	err = c.object(func(key []byte) error {
		switch string(key) {
		case "messages":
			if c.peek() == '[' {
				return c.array(func() error { return w.message(c) })
			}
		case "system":
			if an {
				return w.content(c)
			}
		case "instructions", "input", "prompt":
			if oa {
				return w.content(c)
			}
		case "tools", "functions", "response_format", "tool_choice":
			// Tool definitions and output schemas are rendered into the
			// prompt by the provider; their JSON is a fair measure.
			return w.raw(c)
		case "text":
			if oa { // the Responses API's output format (may hold a schema)
				return w.raw(c)
			}
		case "max_tokens":
			return w.maxOutput(c, &maxOut)
		case "max_completion_tokens", "max_output_tokens":
			if oa {
				return w.maxOutput(c, &maxOut)
			}
		case "n":
			if oa {
				v, ok, err := intMember(c)
				if err != nil {
					return err
				}
				if ok && v > 1 {
					n = v
				}
				return nil
			}
		}
		return c.skip()
	})
	if err != nil {
		return 0, 0, err
	}
	if err := c.end(); err != nil {
		return 0, 0, err
	}
	if maxOut < 0 {
		maxOut = orDefault(w.l.DefaultMaxTokens, DefaultMaxOutputTokens)
	}
	in = w.tokens
	if w.tok == nil {
		cpt := w.l.CharsPerToken
		if cpt == 0 {
			cpt = DefaultCharsPerToken
		}
		in = ceilDiv(w.chars, cpt)
	}
	in = satAdd(in, satMul(w.media, orDefault(w.l.ImageTokens, DefaultImageTokens)))
	return in, satMul(maxOut, n), nil
}

// maxOutput reads an output budget; the largest present wins.
func (w *llmWalk) maxOutput(c *jsonCursor, maxOut *int64) error {
	v, ok, err := intMember(c)
	if ok && v >= 0 && v > *maxOut {
		*maxOut = v
	}
	return err
}

// intMember reads a member that should be an integer. ok is false for null
// or any other kind of value, which the provider would reject.
func intMember(c *jsonCursor) (int64, bool, error) {
	switch c.peek() {
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		v, isInt, err := c.number()
		return v, isInt, err
	}
	return 0, false, c.skip()
}

// text counts a string's characters (or tokens, with a tokenizer).
func (w *llmWalk) text(raw []byte, escaped bool) {
	if w.tok == nil {
		w.chars = satAdd(w.chars, countRunes(raw, escaped))
		return
	}
	w.tokens = satAdd(w.tokens, w.tok.Count(jsonString(raw, escaped)))
}

// raw counts the characters of a value's JSON text.
func (w *llmWalk) raw(c *jsonCursor) error {
	span, err := c.span()
	if err != nil {
		return err
	}
	w.rawSpan(span)
	return nil
}

func (w *llmWalk) rawSpan(span []byte) {
	if len(span) == 0 || string(span) == "null" {
		return
	}
	if w.tok == nil {
		w.chars = satAdd(w.chars, int64(utf8.RuneCount(span)))
		return
	}
	w.tokens = satAdd(w.tokens, w.tok.Count(string(span)))
}

// message reads one element of "messages" (OpenAI or Anthropic).
func (w *llmWalk) message(c *jsonCursor) error {
	if c.peek() != '{' {
		return c.skip()
	}
	return c.object(func(key []byte) error {
		switch string(key) {
		case "content":
			return w.content(c)
		case "tool_calls", "function_call":
			// OpenAI assistant tool calls: names and JSON arguments.
			return w.raw(c)
		}
		return c.skip()
	})
}

// content reads a content value: a string, an array of parts (or strings),
// or a single part object.
func (w *llmWalk) content(c *jsonCursor) error {
	switch c.peek() {
	case '[':
		return c.array(func() error { return w.part(c) })
	case '"', '{': // a plain string reads as a text part
		return w.part(c)
	case 'n':
		return c.literal("null")
	}
	return w.raw(c)
}

// Member slots a content part may use.
const (
	slotText = iota
	slotContent
	slotName
	slotInput
	slotArguments
	slotOutput
	slotRefusal
	slotThinking
	nSlots
)

// part reads one content part (or Responses input item). Its members may
// come in any order, so it first notes where they are, then decides by type.
func (w *llmWalk) part(c *jsonCursor) error {
	switch c.peek() {
	case '"':
		raw, esc, err := c.str()
		if err != nil {
			return err
		}
		w.text(raw, esc)
		return nil
	case '{':
	default:
		return w.raw(c)
	}
	start := c.i
	var typ []byte
	var slots [nSlots][]byte
	err := c.object(func(key []byte) error {
		slot := -1
		switch string(key) {
		case "type":
			if c.peek() == '"' {
				raw, esc, err := c.str()
				if err != nil {
					return err
				}
				typ = raw
				if esc {
					typ = unescapeJSON(nil, raw)
				}
				return nil
			}
		case "text":
			slot = slotText
		case "content":
			slot = slotContent
		case "name":
			slot = slotName
		case "input":
			slot = slotInput
		case "arguments":
			slot = slotArguments
		case "output":
			slot = slotOutput
		case "refusal":
			slot = slotRefusal
		case "thinking":
			slot = slotThinking
		}
		if slot < 0 {
			return c.skip()
		}
		span, err := c.span()
		slots[slot] = span
		return err
	})
	if err != nil {
		return err
	}
	whole := c.b[start:c.i]

	// textOf counts a slot holding a string as text, anything else as JSON.
	textOf := func(slot int) error {
		s := slots[slot]
		if len(s) > 0 && s[0] == '"' {
			sc := c.sub(s)
			raw, esc, err := sc.str()
			if err != nil {
				return err
			}
			w.text(raw, esc)
			return nil
		}
		w.rawSpan(s)
		return nil
	}
	contentOf := func(slot int) error {
		if slots[slot] == nil {
			return nil
		}
		if w.nested >= maxPartNesting {
			w.rawSpan(slots[slot])
			return nil
		}
		w.nested++
		defer func() { w.nested-- }()
		return w.content(c.sub(slots[slot]))
	}

	switch string(typ) {
	case "text", "input_text", "output_text", "summary_text", "reasoning_text":
		return textOf(slotText)
	case "refusal":
		return textOf(slotRefusal)
	case "thinking":
		return textOf(slotThinking)
	case "image", "image_url", "input_image", "image_file",
		"input_audio", "audio", "file", "input_file", "document",
		"video", "video_url":
		w.media++
		return nil
	case "tool_result", "function_call_output", "custom_tool_call_output", "mcp_tool_result":
		if err := contentOf(slotContent); err != nil {
			return err
		}
		return contentOf(slotOutput)
	case "tool_use", "server_tool_use", "mcp_tool_use", "function_call", "custom_tool_call":
		if err := textOf(slotName); err != nil {
			return err
		}
		if err := textOf(slotArguments); err != nil {
			return err
		}
		return textOf(slotInput)
	case "", "message":
		// A message-shaped item (Responses input, or a part without a type).
		if slots[slotContent] != nil {
			return contentOf(slotContent)
		}
		if slots[slotText] != nil {
			return textOf(slotText)
		}
	}
	w.rawSpan(whole)
	return nil
}
