package kube

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/infera/infera/discovery"
)

// AnnotationKey is the Pod annotation that carries a worker's record.
const AnnotationKey = "infera.amd.com/worker-info"

// MaxPodBytes caps one Pod object (or watch event) read from the API server.
const MaxPodBytes = 1 << 20

// ErrInvalidPod is wrapped by every error about a Pod object that cannot be read.
var ErrInvalidPod = errors.New("kube: invalid pod")

// PodState is what discovery makes of one Pod.
type PodState int

// Pod states.
const (
	// PodAbsent: not Running, no annotation, or an invalid record; not in the fleet.
	PodAbsent PodState = iota
	// PodActive: Running with a valid record.
	PodActive
	// PodDraining: has a deletion timestamp; its record is kept as draining.
	PodDraining
)

// pod holds the fields of a v1.Pod discovery reads.
type pod struct {
	Metadata struct {
		Name              string            `json:"name"`
		Namespace         string            `json:"namespace"`
		ResourceVersion   string            `json:"resourceVersion"`
		DeletionTimestamp *string           `json:"deletionTimestamp"`
		Annotations       map[string]string `json:"annotations"`
	} `json:"metadata"`
	Status struct {
		Phase string `json:"phase"`
	} `json:"status"`
}

// PodRecord is the outcome of reading one Pod.
type PodRecord struct {
	Name   string
	State  PodState
	Record discovery.Record
	// Err says why a Pod with an annotation was not taken (invalid record).
	Err error
}

// DecodePod reads a v1.Pod JSON object. A Pod with a deletion timestamp and
// a valid record is draining whatever its phase (it may still finish
// streams); otherwise a Pod is in the fleet only when Running with a valid
// record. The returned error is about the object itself (not JSON, no name);
// an invalid record is reported in PodRecord.Err with State PodAbsent.
func DecodePod(data []byte) (PodRecord, error) {
	if len(data) > MaxPodBytes {
		return PodRecord{}, fmt.Errorf("%w: %d bytes exceeds %d", ErrInvalidPod, len(data), MaxPodBytes)
	}
	var p pod
	if err := json.Unmarshal(data, &p); err != nil {
		return PodRecord{}, fmt.Errorf("%w: decode json: %w", ErrInvalidPod, err)
	}
	return p.record()
}

func (p *pod) record() (PodRecord, error) {
	if p.Metadata.Name == "" {
		return PodRecord{}, fmt.Errorf("%w: no metadata.name", ErrInvalidPod)
	}
	out := PodRecord{Name: p.Metadata.Name}
	val, ok := p.Metadata.Annotations[AnnotationKey]
	if !ok || val == "" {
		return out, nil
	}
	rec, err := discovery.DecodeRecord([]byte(val))
	if err != nil {
		out.Err = err
		return out, nil
	}
	switch {
	case p.Metadata.DeletionTimestamp != nil:
		rec.Status = discovery.StatusDraining
		out.State = PodDraining
	case p.Status.Phase == "Running":
		out.State = PodActive
	default:
		return out, nil
	}
	out.Record = rec
	return out, nil
}

// AnnotationPatch returns the merge patch that writes rec into the Pod's
// annotation: {"metadata":{"annotations":{"infera.amd.com/worker-info":"<record JSON>"}}},
// the record JSON being the etcd value (discovery.Record.Encode) written as
// Python's json.dumps writes it, as the reference's workers do.
func AnnotationPatch(rec *discovery.Record) ([]byte, error) {
	v, err := rec.Encode()
	if err != nil {
		return nil, err
	}
	q, err := json.Marshal(string(pythonJSON(v)))
	if err != nil {
		return nil, fmt.Errorf("kube: quote record: %w", err)
	}
	b := make([]byte, 0, len(q)+64)
	b = append(b, `{"metadata":{"annotations":{"`+AnnotationKey+`":`...)
	b = append(b, q...)
	b = append(b, "}}}"...)
	return b, nil
}

// ClearPatch is the merge patch that removes the annotation (deregistration).
const ClearPatch = `{"metadata":{"annotations":{"` + AnnotationKey + `":null}}}`
