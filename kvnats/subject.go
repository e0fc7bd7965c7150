package kvnats

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/infera/infera/natsx"
)

// The wire names Infera uses for KV events over NATS.
const (
	// SubjectPrefix: events of worker w, DP rank r are published on
	// SubjectPrefix + "." + natsx.Token(w) + "." + r.
	SubjectPrefix = "infera.kv.events"
	// StreamName is the JetStream stream that retains the events.
	StreamName = "INFERA_KV_EVENTS"
	// ViewBucket is the JetStream KV bucket of each rank's view, key
	// natsx.Token(w) + "." + r, value a msgpack array of sorted router hashes.
	ViewBucket = "infera_kv_view"
	// maxRank bounds a rank parsed from a subject or key.
	maxRank = 1 << 16
)

// ErrBadSubject reports a subject or bucket key that names no worker and rank.
var ErrBadSubject = errors.New("kvnats: bad subject")

// Subject is the subject of workerID's rank.
func Subject(workerID string, rank int) string {
	return SubjectPrefix + "." + natsx.Token(workerID) + "." + strconv.Itoa(rank)
}

// ViewKey is the bucket key of workerID's rank.
func ViewKey(workerID string, rank int) string {
	return natsx.Token(workerID) + "." + strconv.Itoa(rank)
}

// ParseSubject returns the worker id and rank a subject names.
func ParseSubject(subject string) (worker string, rank int, err error) {
	rest, ok := strings.CutPrefix(subject, SubjectPrefix+".")
	if !ok {
		return "", 0, fmt.Errorf("%w: %q is not under %s", ErrBadSubject, subject, SubjectPrefix)
	}
	return ParseViewKey(rest)
}

// ParseViewKey returns the worker id and rank a bucket key names.
func ParseViewKey(key string) (worker string, rank int, err error) {
	i := strings.LastIndexByte(key, '.')
	if i <= 0 {
		return "", 0, fmt.Errorf("%w: %q has no <token>.<rank>", ErrBadSubject, key)
	}
	tok, rs := key[:i], key[i+1:]
	if strings.IndexByte(tok, '.') >= 0 {
		return "", 0, fmt.Errorf("%w: %q has more than two tokens", ErrBadSubject, key)
	}
	rank, err = strconv.Atoi(rs)
	if err != nil || rank < 0 || rank >= maxRank || strconv.Itoa(rank) != rs {
		return "", 0, fmt.Errorf("%w: rank %q", ErrBadSubject, rs)
	}
	worker, err = natsx.DecodeToken(tok)
	if err != nil {
		return "", 0, fmt.Errorf("%w: %w", ErrBadSubject, err)
	}
	return worker, rank, nil
}
