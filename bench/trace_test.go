package bench

import (
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestParseTraceValid(t *testing.T) {
	in := `{"timestamp": 0, "input_length": 40, "output_length": 6, "hash_ids": [0, 1]}

{"timestamp": 12, "input_length": 7, "output_length": 0, "hash_ids": [], "extra": "ignored"}
  {"timestamp":30,"input_length":1,"output_length":2,"hash_ids":[5]}  
`
	got, err := ParseTrace(strings.NewReader(in), 0)
	if err != nil {
		t.Fatal(err)
	}
	want := []TraceRecord{
		{Timestamp: 0, InputLength: 40, OutputLength: 6, HashIDs: []int64{0, 1}},
		{Timestamp: 12, InputLength: 7, OutputLength: 0, HashIDs: []int64{}},
		{Timestamp: 30, InputLength: 1, OutputLength: 2, HashIDs: []int64{5}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ParseTrace = %+v, want %+v", got, want)
	}
	limited, err := ParseTrace(strings.NewReader(in), 2)
	if err != nil || len(limited) != 2 {
		t.Fatalf("limit 2: %d records, %v", len(limited), err)
	}
}

func TestParseTraceMalformed(t *testing.T) {
	good := `{"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [0]}` + "\n"
	cases := []struct {
		name, line string
		wantLine   int
		wantText   string
	}{
		{"not json", `{"timestamp": 0,`, 2, "not a JSON object"},
		{"array", `[1, 2]`, 2, "not a JSON object"},
		{"missing timestamp", `{"input_length": 4, "output_length": 1, "hash_ids": []}`, 2, "missing timestamp"},
		{"missing input", `{"timestamp": 4, "output_length": 1, "hash_ids": []}`, 2, "missing input_length"},
		{"missing output", `{"timestamp": 4, "input_length": 1, "hash_ids": []}`, 2, "missing output_length"},
		{"missing hash ids", `{"timestamp": 4, "input_length": 1, "output_length": 1}`, 2, "missing hash_ids"},
		{"null", `null`, 2, "missing timestamp"},
		{"negative timestamp", `{"timestamp": -1, "input_length": 1, "output_length": 1, "hash_ids": []}`, 2, "negative"},
		{"zero input", `{"timestamp": 1, "input_length": 0, "output_length": 1, "hash_ids": []}`, 2, "input_length 0"},
		{"huge input", `{"timestamp": 1, "input_length": 999999999, "output_length": 1, "hash_ids": []}`, 2, "out of range"},
		{"negative output", `{"timestamp": 1, "input_length": 1, "output_length": -3, "hash_ids": []}`, 2, "output_length -3"},
		{"negative hash", `{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [1, -2]}`, 2, "hash_ids[1]"},
		{"float length", `{"timestamp": 1, "input_length": 1.5, "output_length": 1, "hash_ids": []}`, 2, "not a JSON object"},
		{"string hash", `{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": ["a"]}`, 2, "not a JSON object"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseTrace(strings.NewReader(good+tc.line+"\n"+good), 0)
			if !errors.Is(err, ErrInvalidTrace) {
				t.Fatalf("err = %v, want ErrInvalidTrace", err)
			}
			if want := "line " + string(rune('0'+tc.wantLine)) + ":"; !strings.Contains(err.Error(), want) {
				t.Fatalf("err = %q, want it to name %q", err, want)
			}
			if !strings.Contains(err.Error(), tc.wantText) {
				t.Fatalf("err = %q, want it to say %q", err, tc.wantText)
			}
		})
	}
	if _, err := ParseTrace(strings.NewReader("\n\n"), 0); !errors.Is(err, ErrInvalidTrace) {
		t.Fatalf("empty trace: err = %v, want ErrInvalidTrace", err)
	}
	// The line number counts blank lines too.
	_, err := ParseTrace(strings.NewReader(good+"\n\n"+"oops\n"), 0)
	if err == nil || !strings.Contains(err.Error(), "line 4:") {
		t.Fatalf("err = %v, want line 4", err)
	}
}

func TestLoadTraceFile(t *testing.T) {
	recs, err := LoadTrace(filepath.Join("testdata", "trace_sample.jsonl"), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 8 {
		t.Fatalf("%d records, want 8", len(recs))
	}
	if _, err := LoadTrace(filepath.Join(t.TempDir(), "missing.jsonl"), 0); err == nil {
		t.Fatal("missing file: no error")
	}
}
