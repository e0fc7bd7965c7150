package anthropic

import (
	"errors"

	"github.com/infera/infera/jsonx"
)

// Anthropic's error types ("error.type" of the envelope).
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeAuthentication = "authentication_error"
	TypePermission     = "permission_error"
	TypeNotFound       = "not_found_error"
	TypeTooLarge       = "request_too_large"
	TypeRateLimit      = "rate_limit_error"
	TypeAPI            = "api_error"
	TypeOverloaded     = "overloaded_error"
)

// StatusOverloaded is Anthropic's status for an overloaded service.
const StatusOverloaded = 529

// Sentinel errors of the request translation (wrapped with detail).
var (
	// ErrInvalidRequest: the body is not a valid Messages request.
	ErrInvalidRequest = errors.New("invalid messages request")
	// ErrUnsupported: the request asks for content the engines cannot take
	// (images, documents, server tools).
	ErrUnsupported = errors.New("unsupported content")
)

// ErrorType is Anthropic's error type for an HTTP status.
func ErrorType(status int) string {
	switch status {
	case 400, 405, 422:
		return TypeInvalidRequest
	case 401:
		return TypeAuthentication
	case 403:
		return TypePermission
	case 404:
		return TypeNotFound
	case 413:
		return TypeTooLarge
	case 429:
		return TypeRateLimit
	case 503, StatusOverloaded:
		return TypeOverloaded
	}
	if status >= 400 && status < 500 {
		return TypeInvalidRequest
	}
	return TypeAPI
}

// Status is the status Anthropic answers with for the router's status:
// an unavailable service (503) is Anthropic's 529 overloaded; the rest
// keep theirs.
func Status(status int) int {
	if status == 503 {
		return StatusOverloaded
	}
	return status
}

// AppendError appends Anthropic's error envelope
// {"type":"error","error":{"type":…,"message":…}}.
func AppendError(dst []byte, errType, message string) []byte {
	dst = append(dst, `{"type":"error","error":{"type":`...)
	dst = jsonx.AppendQuoted(dst, errType)
	dst = append(dst, `,"message":`...)
	dst = jsonx.AppendQuoted(dst, message)
	return append(dst, "}}"...)
}

// AppendErrorEvent appends the SSE error event of a failing stream.
func AppendErrorEvent(dst []byte, errType, message string) []byte {
	dst = append(dst, "event: error\ndata: "...)
	dst = AppendError(dst, errType, message)
	return append(dst, "\n\n"...)
}

// AppendEngineError appends, for an engine's error answer body (the OpenAI
// envelope, or anything else) with HTTP status, the Anthropic envelope
// carrying the engine's message.
func AppendEngineError(dst, body []byte, status int) []byte {
	msg := engineMessage(body)
	dst = append(dst, `{"type":"error","error":{"type":`...)
	dst = jsonx.AppendQuoted(dst, ErrorType(status))
	dst = append(dst, `,"message":`...)
	if msg.raw != nil {
		dst = append(append(append(dst, '"'), msg.raw...), '"')
	} else {
		b := body
		if len(b) > 1024 {
			b = b[:1024]
		}
		if len(b) == 0 {
			dst = jsonx.AppendQuoted(dst, "engine answered status "+itoa(status))
		} else {
			dst = jsonx.AppendQuoted(dst, b)
		}
	}
	return append(dst, "}}"...)
}

// rawString is a validated JSON string's raw content (nil: none).
type rawString struct {
	raw []byte
	esc bool
}

// engineMessage finds error.message (or a top-level message/detail) in an
// engine's error body.
func engineMessage(body []byte) rawString {
	s := jsonx.Scanner{B: body, MaxDepth: maxDepth}
	s.SkipWS()
	var out rawString
	s.Members(func(ks, ke int, kesc bool) bool {
		key := body[ks:ke]
		switch {
		case string(key) == "error" && s.I < len(body) && body[s.I] == '{':
			s.Members(func(ks2, ke2 int, _ bool) bool {
				if string(body[ks2:ke2]) == "message" {
					out = readString(&s)
					return out.raw != nil || s.Value() == nil
				}
				return s.Value() == nil
			})
			return true
		case (string(key) == "message" || string(key) == "detail") && out.raw == nil:
			out = readString(&s)
			return out.raw != nil || s.Value() == nil
		}
		return s.Value() == nil
	})
	return out
}

// readString reads the string at s.I; a non-string is left in place.
func readString(s *jsonx.Scanner) rawString {
	if s.I >= len(s.B) || s.B[s.I] != '"' {
		return rawString{}
	}
	st, en, esc, err := s.String()
	if err != nil {
		return rawString{}
	}
	return rawString{raw: s.B[st:en:en], esc: esc}
}
