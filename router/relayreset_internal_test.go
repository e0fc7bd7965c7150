package router

import (
	"context"
	"errors"
	"net"
	"reflect"
	"strings"
	"testing"
	"unsafe"

	"go.opentelemetry.io/otel/trace"

	"github.com/infera/infera/continuation"
	"github.com/infera/infera/router/upstream"
)

// relayKept are the relay's parts that reset keeps for the next request:
// slices kept as empty buffers (their backing arrays) but for the pump's
// read buffer (kept whole), the rest as they are (a PD request's leg
// scratches: each part is written before it is read). Every other part
// must be as in a new relay after reset.
var relayKept = map[string]bool{
	"id": true, "reqBuf": true, "tried": true, "scan.scratch": true, "scan.Walk": true, "legs": true, "handoff": true, "pdWalk": true,
	"pump.buf": true, "pump.out": true,
	"xlate": true, "xlateEvent": true, "mig": true, "trackEvent": true,
	"ureq": true, "uresp": true, "urespOut": true,
	"relayRequest.sub.Workers": true, "relayRequest.watch.slot": true, "relayRequest.watch.peek.fn": true,
	"relayRequest.att.hintBuf": true, "relayRequest.att.hintTmp": true, "relayRequest.att.x": true,
}

// TestRelayResetLeavesNothingStale: a relay whose every part was set, as
// a stream with every option leaves it and more, is after reset a new
// relay but for its kept buffers (emptied) and bound parts: what the next
// request, a plain unary one, sees is what a fresh relay shows it. Fails
// if reset leaves any part a request sets, including one added later
// outside relayRequest and not listed in relayKept.
func TestRelayResetLeavesNothingStale(t *testing.T) {
	rel := new(relay)
	fillValue(t, reflect.ValueOf(rel).Elem(), "")
	rel.mig = new(migration) // empty() follows no pointer of a zero one
	// A copy through reflect: the relay holds atomics (not to be copied
	// by assignment), unused here.
	before := reflect.New(reflect.TypeFor[relay]()).Elem()
	before.Set(reflect.ValueOf(rel).Elem())
	rel.reset()
	checkReset(t, reflect.ValueOf(rel).Elem(), before, "")

	// The checks above are live: a part left set is found.
	rel.relayRequest.att.exact = true
	var found []string
	checkResetInto(reflect.ValueOf(rel).Elem(), before, "", &found)
	if len(found) != 1 || found[0] != "relayRequest.att.exact" {
		t.Fatalf("a part left set found as %v", found)
	}
}

// settable is v, writable even when it is an unexported field.
func settable(v reflect.Value) reflect.Value {
	return reflect.NewAt(v.Type(), unsafe.Pointer(v.UnsafeAddr())).Elem()
}

// interfaceFills are values an interface part is filled with, the first
// that implements it (a nil pointer in an interface is not its zero).
var interfaceFills = []reflect.Value{
	reflect.ValueOf(errors.New("filled")),
	reflect.ValueOf((*net.TCPConn)(nil)),
	reflect.ValueOf((*relay)(nil)),
	reflect.ValueOf((*attempt)(nil)),
	reflect.ValueOf((*upstream.Exchange)(nil)),
	reflect.ValueOf((*continuation.Tracker)(nil)),
	reflect.ValueOf(trace.SpanFromContext(context.Background())), // a no-op span
}

// fillValue sets every leaf of v to a value other than its zero.
func fillValue(t *testing.T, v reflect.Value, path string) {
	t.Helper()
	v = settable(v)
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			fillValue(t, v.Field(i), join(path, v.Type().Field(i).Name))
		}
	case reflect.Array:
		for i := range v.Len() {
			fillValue(t, v.Index(i), path)
		}
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(1)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		v.SetUint(1)
	case reflect.Float32, reflect.Float64:
		v.SetFloat(1)
	case reflect.String:
		v.SetString("x")
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 1, 1))
	case reflect.Map:
		v.Set(reflect.MakeMap(v.Type()))
	case reflect.Chan:
		v.Set(reflect.MakeChan(v.Type(), 0))
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
	case reflect.Func:
		v.Set(reflect.MakeFunc(v.Type(), func([]reflect.Value) []reflect.Value { return nil }))
	case reflect.Interface:
		for _, c := range interfaceFills {
			if c.Type().Implements(v.Type()) {
				v.Set(c)
				return
			}
		}
		t.Fatalf("%s: no value to fill an interface %s with", path, v.Type())
	default:
		t.Fatalf("%s: cannot fill a %s", path, v.Kind())
	}
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

func checkReset(t *testing.T, got, before reflect.Value, path string) {
	t.Helper()
	var found []string
	checkResetInto(got, before, path, &found)
	if len(found) > 0 {
		t.Fatalf("parts a request set left by reset:\n%s", strings.Join(found, "\n"))
	}
}

// checkResetInto notes in found each part of got (after reset) that is
// neither zero nor, if kept, as before (an emptied buffer for a slice).
func checkResetInto(got, before reflect.Value, path string, found *[]string) {
	if relayKept[path] {
		if got.Kind() == reflect.Slice {
			want := 0
			if path == "pump.buf" {
				want = before.Len()
			}
			if got.Len() != want || got.Cap() != before.Cap() || got.UnsafePointer() != before.UnsafePointer() {
				*found = append(*found, path+" (a kept buffer not kept in place, or not emptied)")
			}
			return
		}
		if !reflect.DeepEqual(settable(got).Interface(), settable(before).Interface()) &&
			(got.Kind() != reflect.Func || got.Pointer() != before.Pointer()) {
			*found = append(*found, path+" (kept, but changed)")
		}
		return
	}
	if got.Kind() == reflect.Struct {
		for i := range got.NumField() {
			checkResetInto(got.Field(i), before.Field(i), join(path, got.Type().Field(i).Name), found)
		}
		return
	}
	if !got.IsZero() {
		*found = append(*found, path)
	}
}
