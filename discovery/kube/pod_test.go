package kube

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/infera/infera/discovery"
)

func sampleRecord() discovery.Record {
	ep := "tcp://10.0.0.7:5557"
	bs := 16
	return discovery.Record{
		WorkerID:         "10.0.0.7:8000",
		URL:              "http://10.0.0.7:8000",
		ModelName:        "Qwen/Qwen3-0.6B <ünïcode> & 🚀",
		Engine:           "vllm",
		DisaggMode:       discovery.DisaggPrefill,
		DisaggMeta:       discovery.DisaggMeta{Protocol: "vllm-nixl", Params: map[string]any{"side_channel_port": float64(5600)}},
		KVEventsEndpoint: &ep,
		KVBlockSize:      &bs,
	}
}

// The annotation value is byte for byte what Python's json.dumps writes for
// the same record (testdata/annotation.golden was written by
// python3 -c 'import json,sys; print(json.dumps(json.loads(sys.stdin.read())), end="")'
// from the record's compact JSON).
func TestAnnotationPatchGolden(t *testing.T) {
	rec := sampleRecord()
	patch, err := AnnotationPatch(&rec)
	if err != nil {
		t.Fatal(err)
	}
	var p struct {
		Metadata struct {
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(patch, &p); err != nil {
		t.Fatalf("patch %s: %v", patch, err)
	}
	want, err := os.ReadFile("testdata/annotation.golden")
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Metadata.Annotations[AnnotationKey]; got != string(want) {
		t.Fatalf("annotation\n got %s\nwant %s", got, want)
	}
	back, err := discovery.DecodeRecord(want)
	if err != nil {
		t.Fatal(err)
	}
	if back.ModelName != rec.ModelName {
		t.Fatalf("model name %q, want %q", back.ModelName, rec.ModelName)
	}
}

func podJSON(t testing.TB, phase string, deleting bool, annotation *string) []byte {
	m := map[string]any{"name": "w-0", "namespace": "default", "resourceVersion": "42"}
	if deleting {
		m["deletionTimestamp"] = "2026-12-04T13:00:00Z"
	}
	if annotation != nil {
		m["annotations"] = map[string]string{AnnotationKey: *annotation}
	}
	b, err := json.Marshal(map[string]any{"metadata": m, "status": map[string]any{"phase": phase}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecodePodStates(t *testing.T) {
	rec := sampleRecord()
	v, err := rec.Encode()
	if err != nil {
		t.Fatal(err)
	}
	good := string(v)
	bad := `{"worker_id":""}`
	for _, tc := range []struct {
		name     string
		phase    string
		deleting bool
		ann      *string
		want     PodState
		wantErr  bool
	}{
		{"running", "Running", false, &good, PodActive, false},
		{"pending", "Pending", false, &good, PodAbsent, false},
		{"no annotation", "Running", false, nil, PodAbsent, false},
		{"deleting", "Running", true, &good, PodDraining, false},
		{"invalid record", "Running", false, &bad, PodAbsent, true},
	} {
		pr, err := DecodePod(podJSON(t, tc.phase, tc.deleting, tc.ann))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if pr.State != tc.want || (pr.Err != nil) != tc.wantErr {
			t.Fatalf("%s: state %d err %v, want %d (err %v)", tc.name, pr.State, pr.Err, tc.want, tc.wantErr)
		}
		if pr.State == PodDraining && pr.Record.Status != discovery.StatusDraining {
			t.Fatalf("%s: status %q", tc.name, pr.Record.Status)
		}
	}
	if _, err := DecodePod([]byte(`{"metadata":{}}`)); err == nil {
		t.Fatal("pod without a name accepted")
	}
}

func TestClearPatch(t *testing.T) {
	var v map[string]map[string]map[string]*string
	if err := json.Unmarshal([]byte(ClearPatch), &v); err != nil {
		t.Fatal(err)
	}
	if a, ok := v["metadata"]["annotations"][AnnotationKey]; !ok || a != nil {
		t.Fatalf("clear patch %s", ClearPatch)
	}
	if !strings.Contains(ClearPatch, AnnotationKey) {
		t.Fatal("clear patch names no annotation")
	}
}

// FuzzDecodePod: any bytes as a Pod object never panic; an accepted record
// re-encodes and decodes to the same worker.
func FuzzDecodePod(f *testing.F) {
	rec := sampleRecord()
	v, _ := rec.Encode()
	s := string(v)
	f.Add(podJSON(f, "Running", false, &s))
	f.Add(podJSON(f, "Running", true, &s))
	f.Add([]byte(`{"metadata":{"name":"x","annotations":{"infera.amd.com/worker-info":"{}"}},"status":{"phase":"Running"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		pr, err := DecodePod(data)
		if err != nil || pr.State == PodAbsent {
			return
		}
		patch, err := AnnotationPatch(&pr.Record)
		if err != nil {
			t.Fatalf("accepted record does not encode: %v", err)
		}
		var p struct {
			Metadata struct {
				Annotations map[string]string `json:"annotations"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(patch, &p); err != nil {
			t.Fatalf("patch not json: %v", err)
		}
		back, err := discovery.DecodeRecord([]byte(p.Metadata.Annotations[AnnotationKey]))
		if err != nil || back.WorkerID != pr.Record.WorkerID {
			t.Fatalf("round trip: %v %q", err, back.WorkerID)
		}
	})
}
