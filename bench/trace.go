package bench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
)

// ErrInvalidTrace is wrapped by every trace parsing error; the message names
// the offending line.
var ErrInvalidTrace = errors.New("invalid trace")

// TraceRecord is one line of a Mooncake-format trace.
type TraceRecord struct {
	// Timestamp is the arrival time in milliseconds from the start of the trace.
	Timestamp int64 `json:"timestamp"`
	// InputLength is the prompt length in tokens.
	InputLength int `json:"input_length"`
	// OutputLength is the number of tokens generated.
	OutputLength int `json:"output_length"`
	// HashIDs names the prompt's 512-token blocks; equal ids are equal blocks.
	HashIDs []int64 `json:"hash_ids"`
}

// Bounds on a trace record: far above any real request, low enough that a
// corrupt line cannot make the generator allocate gigabytes.
const (
	maxTraceInputLength = 4 << 20
	maxTraceLineBytes   = 64 << 20
)

// traceLine mirrors TraceRecord with pointers, so a missing field is told
// apart from a zero one.
type traceLine struct {
	Timestamp    *int64   `json:"timestamp"`
	InputLength  *int     `json:"input_length"`
	OutputLength *int     `json:"output_length"`
	HashIDs      *[]int64 `json:"hash_ids"`
}

// ParseTrace reads a Mooncake jsonl trace: one JSON object per line with
// timestamp (ms, >= 0), input_length (> 0), output_length (>= 0) and hash_ids
// (array of non-negative integers); blank lines are skipped and unknown
// fields ignored. limit > 0 stops after that many records. Any other line is
// an error wrapping ErrInvalidTrace that names its line number.
func ParseTrace(r io.Reader, limit int) ([]TraceRecord, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxTraceLineBytes)
	var out []TraceRecord
	line := 0
	for sc.Scan() {
		line++
		text := bytes.TrimSpace(sc.Bytes())
		if len(text) == 0 {
			continue
		}
		rec, err := parseTraceLine(text)
		if err != nil {
			return nil, fmt.Errorf("%w: line %d: %w", ErrInvalidTrace, line, err)
		}
		out = append(out, rec)
		if limit > 0 && len(out) >= limit {
			return out, nil
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("%w: line %d: longer than %d bytes", ErrInvalidTrace, line+1, maxTraceLineBytes)
		}
		return nil, fmt.Errorf("read trace: %w", err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no records", ErrInvalidTrace)
	}
	return out, nil
}

func parseTraceLine(text []byte) (TraceRecord, error) {
	var l traceLine
	if err := json.Unmarshal(text, &l); err != nil {
		return TraceRecord{}, fmt.Errorf("not a JSON object: %w", err)
	}
	switch {
	case l.Timestamp == nil:
		return TraceRecord{}, errors.New("missing timestamp")
	case l.InputLength == nil:
		return TraceRecord{}, errors.New("missing input_length")
	case l.OutputLength == nil:
		return TraceRecord{}, errors.New("missing output_length")
	case l.HashIDs == nil:
		return TraceRecord{}, errors.New("missing hash_ids")
	}
	rec := TraceRecord{Timestamp: *l.Timestamp, InputLength: *l.InputLength, OutputLength: *l.OutputLength, HashIDs: *l.HashIDs}
	switch {
	case rec.Timestamp < 0:
		return TraceRecord{}, fmt.Errorf("timestamp %d is negative", rec.Timestamp)
	case rec.InputLength <= 0 || rec.InputLength > maxTraceInputLength:
		return TraceRecord{}, fmt.Errorf("input_length %d out of range 1..%d", rec.InputLength, maxTraceInputLength)
	case rec.OutputLength < 0:
		return TraceRecord{}, fmt.Errorf("output_length %d is negative", rec.OutputLength)
	}
	for k, h := range rec.HashIDs {
		if h < 0 {
			return TraceRecord{}, fmt.Errorf("hash_ids[%d] = %d is negative", k, h)
		}
	}
	return rec, nil
}

// LoadTrace parses the trace file at path (see ParseTrace).
func LoadTrace(path string, limit int) ([]TraceRecord, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open trace: %w", err)
	}
	defer f.Close()
	recs, err := ParseTrace(f, limit)
	if err != nil {
		return nil, fmt.Errorf("trace %s: %w", path, err)
	}
	return recs, nil
}
