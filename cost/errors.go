package cost

import (
	"fmt"
	"net/http"
)

// Problem types carried by [InputError.Type]. They are short slugs; the caller
// may turn them into URIs for an RFC 9457 problem document.
const (
	TypeBodyTooLarge          = "body-too-large"
	TypeBodyRead              = "body-read-error"
	TypeMalformedJSON         = "malformed-json"
	TypeUnsupportedMediaType  = "unsupported-media-type"
	TypeMissingHeader         = "missing-cost-header"
	TypeInvalidHeader         = "invalid-cost-header"
	TypeGraphQLParse          = "graphql-parse-error"
	TypeGraphQLMissingQuery   = "graphql-missing-query"
	TypeGraphQLTooManyTokens  = "graphql-too-many-tokens"
	TypeGraphQLTooDeep        = "graphql-too-deep"
	TypeGraphQLTooManyAliases = "graphql-too-many-aliases"
	TypeGraphQLTooManyDirs    = "graphql-too-many-directives"
	TypeGraphQLFragmentCycle  = "graphql-fragment-cycle"
	TypeGraphQLUnknownFrag    = "graphql-unknown-fragment"
	TypeGraphQLUnknownOp      = "graphql-unknown-operation"
	TypeGraphQLAmbiguousOp    = "graphql-ambiguous-operation"
	TypeGraphQLNoOperation    = "graphql-no-operation"
	TypeGraphQLBatchTooLarge  = "graphql-batch-too-large"
	TypeGraphQLCostExceeded   = "graphql-cost-exceeded"
	TypeGraphQLInvalidRequest = "graphql-invalid-request"
)

// InputError reports a request the estimator refuses because of the client:
// a body over the bound, malformed JSON, a GraphQL query over a guard. It
// carries what an RFC 9457 problem document needs; the caller answers with
// Status and does not forward the request.
type InputError struct {
	// Status is the HTTP status to answer with: usually 400, 413 for a body
	// over the bound, 415 for a media type the estimator cannot read.
	Status int
	// Type is a short slug such as "malformed-json" or "graphql-too-deep"
	// (see the Type* constants).
	Type string
	// Title is a short, human-readable summary of the problem type.
	Title string
	// Detail explains this occurrence.
	Detail string
	// Err is the underlying cause, if any (for example a parser error).
	Err error
}

func (e *InputError) Error() string {
	if e.Detail == "" {
		return e.Title
	}
	return e.Title + ": " + e.Detail
}

// Unwrap returns the underlying cause.
func (e *InputError) Unwrap() error { return e.Err }

// inputErr builds a 400 InputError.
func inputErr(typ, title, format string, args ...any) *InputError {
	return &InputError{Status: http.StatusBadRequest, Type: typ, Title: title, Detail: fmt.Sprintf(format, args...)}
}

func tooLarge(limit int64) *InputError {
	return &InputError{
		Status: http.StatusRequestEntityTooLarge,
		Type:   TypeBodyTooLarge,
		Title:  "Request body too large to estimate",
		Detail: fmt.Sprintf("the body is larger than the %d bytes this endpoint reads to estimate its cost", limit),
	}
}
