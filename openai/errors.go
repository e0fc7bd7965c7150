package openai

import "github.com/infera/infera/jsonx"

// Error types used in the envelope's "type" field, as OpenAI names them.
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeNotFound       = "not_found_error"
	TypeServer         = "server_error"
	TypeUnavailable    = "service_unavailable_error"
)

// AppendError appends the OpenAI error envelope
// {"error":{"message":…,"type":…,"code":…}} to dst. An empty code is
// written as null, as OpenAI does for errors without a code.
func AppendError(dst []byte, message, errType, code string) []byte {
	dst = append(dst, `{"error":{"message":`...)
	dst = AppendQuoted(dst, message)
	dst = append(dst, `,"type":`...)
	dst = AppendQuoted(dst, errType)
	dst = append(dst, `,"code":`...)
	if code == "" {
		dst = append(dst, "null"...)
	} else {
		dst = AppendQuoted(dst, code)
	}
	return append(dst, "}}"...)
}

// AppendQuoted appends s as a JSON string literal, as encoding/json writes
// it (see jsonx.AppendQuoted).
func AppendQuoted(dst []byte, s string) []byte { return jsonx.AppendQuoted(dst, s) }
