package discovery_test

import (
	"errors"
	"reflect"
	"testing"

	"github.com/infera/infera/discovery"
)

// FuzzDecodeRecord: no input panics; every rejection wraps ErrInvalidRecord;
// every accepted record re-encodes, and decoding that gives the same record.
func FuzzDecodeRecord(f *testing.F) {
	for _, s := range []string{
		`{"worker_id": "192.168.1.20:8000", "url": "http://192.168.1.20:8000", "model_name": "m", "engine": "vllm", "disagg_mode": "mixed", "disagg_meta": {}, "kv_events_endpoint": null, "kv_block_size": null, "dp_rank": null, "dp_size": 1, "request_transport": "http"}`,
		`{"worker_id":"[::1]:30000","url":"https://[::1]:30000/","model_name":"x","engine":"sglang","disagg_mode":"decode","disagg_meta":{"protocol":"vllm-nixl","params":{"a":[1,{"b":null}],"c":"d"}},"kv_events_endpoint":"tcp://h:1","kv_events_replay_endpoint":"tcp://h:2","kv_block_size":16,"kv_capacity_blocks":400,"dp_rank":0,"dp_size":2,"request_transport":"http","status":"draining"}`,
		`{"worker_id":"h:1","url":"http://h:1","model_name":"m","engine":"sim","dp_size":0,"kv_events_endpoint":"","kv_events_replay_endpoint":""}`,
		`{"worker_id":"h:1","url":"http://h:1","model_name":"m","engine":"sim","disagg_meta":{"params":{}}}`,
		`{"WORKER_ID":"h:1","url":"http://h:1","model_name":"m","engine":"sim","model_name":"n"}`,
		`{"worker_id":"h:1","url":"http://h:1","model_name":"\ud800","engine":"atom","disagg_meta":{"params":{"n":1e308,"z":-0}}}`,
		`{"worker_id": "::1:28106", "url": "http://::1:28106", "model_name": "m", "kv_events_endpoint": "tcp://fe80::1:5557", "request_transport": "nats", "status": "dead"}`,
		`{"worker_id":"h:1","url":"http://h:1","model_name":"m","engine":"vllm","kv": {"tokenizer_canary": [1, 2], "tiers": ["device"]},"real_engine":"sim"}`,
		`{"worker_id":"h:1","url":"http://h:1","model_name":"m","kv":null}`,
		`{"worker_id":"h:1","url":"http://h:1","model_name":"0","kv":{"&":[],"<a>":"\u0026"}}`,
		`{"worker_id":"h:1"}`,
		`null`,
		`{}`,
		``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkRoundTrip(t, data, discovery.DecodeRecord, (*discovery.Record).Encode, discovery.ErrInvalidRecord)
	})
}

// checkRoundTrip is what the record fuzz targets check: data is rejected
// with an error that wraps invalid, or the record accepted encodes and
// decodes again to the same record.
func checkRoundTrip[T any](t *testing.T, data []byte, decode func([]byte) (T, error), encode func(*T) ([]byte, error), invalid error) {
	t.Helper()
	r, err := decode(data)
	if err != nil {
		if !errors.Is(err, invalid) {
			t.Fatalf("error does not wrap %q: %v", invalid, err)
		}
		return
	}
	enc, err := encode(&r)
	if err != nil {
		t.Fatalf("accepted record does not encode: %v\nrecord %#v", err, r)
	}
	again, err := decode(enc)
	if err != nil {
		t.Fatalf("re-encoded record rejected: %v\n%s", err, enc)
	}
	if !reflect.DeepEqual(r, again) {
		t.Fatalf("round trip changed the record\nfirst  %#v\nsecond %#v", r, again)
	}
}

// FuzzDecodeKVDRecord: as FuzzDecodeRecord, for the kvd registry's records.
func FuzzDecodeKVDRecord(f *testing.F) {
	for _, s := range []string{
		`{"host":"10.0.0.7","peer":"10.0.0.7:9480","transport":{"kind":"tcp","addr":"10.0.0.7:9481"}}`,
		`{"host":"[fd00::7]","peer":"fd00::7:9480","transport":{"kind":"tcp","addr":"fd00::7:9481"}}`,
		`{"host":"node-7","peer":"node-7:9480","transport":{"kind":"mooncake","addr":"node-7:12001"}}`,
		`{"host":"n","peer":"n:1","transport":{"kind":"mori","addr":"key"},"x":[1]}`,
		`{"host":"n","peer":"n:1","transport":{"kind":"tcp"}}`,
		`null`,
		`{}`,
		``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkRoundTrip(t, data, discovery.DecodeKVDRecord, (*discovery.KVDRecord).Encode, discovery.ErrInvalidKVDRecord)
	})
}
