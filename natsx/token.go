package natsx

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// maxWorkerID bounds a worker id decoded from a token.
const maxWorkerID = 1024

// ErrBadToken reports a subject token that is no worker id.
var ErrBadToken = errors.New("natsx: bad token")

// Token is the subject- and key-safe name of a worker: URL-safe base64 of
// its id without padding ("10.0.0.1:8080" → "MTAuMC4wLjE6ODA4MA").
func Token(workerID string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(workerID))
}

// DecodeToken is the inverse of Token. It accepts padded tokens too, as
// Python's decoder does, and rejects ids that are empty, too long or not
// UTF-8.
func DecodeToken(tok string) (string, error) {
	tok = strings.TrimRight(tok, "=")
	if tok == "" || len(tok) > maxWorkerID*4/3+4 {
		return "", fmt.Errorf("%w: token length %d", ErrBadToken, len(tok))
	}
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return "", fmt.Errorf("%w: token %q: %w", ErrBadToken, tok, err)
	}
	if len(b) == 0 || !utf8.Valid(b) {
		return "", fmt.Errorf("%w: token %q is no worker id", ErrBadToken, tok)
	}
	return string(b), nil
}
