//go:build rocm

package rocm

import (
	"bytes"
	"errors"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
)

// openStub builds testdata/hipstub with the C compiler and opens it.
func openStub(t *testing.T) *HIP {
	t.Helper()
	lib := filepath.Join(t.TempDir(), "libhipstub.so")
	cc := exec.Command("cc", "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", lib, filepath.Join("testdata", "hipstub", "hipstub.c"), "-lpthread")
	if out, err := cc.CombinedOutput(); err != nil {
		t.Fatalf("build the HIP stub: %v\n%s", err, out)
	}
	h, err := OpenHIP(lib)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	return h
}

func TestHIPDevices(t *testing.T) {
	h := openStub(t)
	n, err := h.DeviceCount()
	if err != nil || n != 2 {
		t.Fatalf("DeviceCount = %d, %v", n, err)
	}
	p, err := h.Device(1)
	if err != nil || p.TotalMemory != 1<<30 || p.PCIBusID != "0000:23:00.0" || p.Name != "AMD Instinct MI355X (stub 1)" {
		t.Fatalf("Device(1) = %+v, %v", p, err)
	}
	_, err = h.Device(7)
	var he *HIPError
	if !errors.As(err, &he) || he.Op != "hipDeviceGetName" || he.Name != "hipErrorInvalidDevice" || !errors.Is(err, ErrHIPNoDevice) || !errors.Is(err, ErrHIP) {
		t.Fatalf("Device(7): %v, want hipErrorInvalidDevice mapped to ErrHIPNoDevice", err)
	}
}

func TestHIPMemoryRoundTrip(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	h := openStub(t)
	if err := h.SetDevice(1); err != nil {
		t.Fatal(err)
	}
	m, err := h.Malloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	src := bytes.Repeat([]byte("kv-block"), 512)
	if err := h.CopyToDevice(m, 4096, src); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(src))
	if err := h.CopyFromDevice(got, m, 4096); err != nil || !bytes.Equal(got, src) {
		t.Fatalf("CopyFromDevice: %v, equal %t", err, bytes.Equal(got, src))
	}
	// Out of bounds is refused before HIP is called.
	if err := h.CopyToDevice(m, m.Size()-1, src); !errors.Is(err, ErrHIPArgument) {
		t.Fatalf("out of bounds copy: %v", err)
	}
	// Over-allocation maps to ErrHIPOutOfMemory.
	if _, err := h.Malloc(2 << 30); !errors.Is(err, ErrHIPOutOfMemory) {
		t.Fatalf("Malloc(2 GiB): %v, want ErrHIPOutOfMemory", err)
	}
	if err := h.Free(m); err != nil {
		t.Fatal(err)
	}
	// A second free is HIP's error, not a crash.
	var he *HIPError
	if err := h.Free(m); !errors.As(err, &he) || he.Code != 1 {
		t.Fatalf("double Free: %v", err)
	}
}

// TestHIPInjectedFailure: a deliberately failed hipMemcpy comes back as a
// HIPError naming the call and the code.
func TestHIPInjectedFailure(t *testing.T) {
	h := openStub(t)
	m, err := h.Malloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h.Free(m) }()
	t.Setenv("HIPSTUB_FAIL", "hipMemcpy=700") // hipErrorIllegalAddress
	err = h.CopyToDevice(m, 0, []byte("x"))
	var he *HIPError
	if !errors.As(err, &he) || he.Op != "hipMemcpy" || he.Code != 700 || !errors.Is(err, ErrHIP) || errors.Is(err, ErrHIPOutOfMemory) {
		t.Fatalf("injected failure: %v", err)
	}
	t.Setenv("HIPSTUB_FAIL", "")
	if err := h.CopyToDevice(m, 0, []byte("x")); err != nil {
		t.Fatalf("after the injection: %v", err)
	}
}

func TestHIPHostRegister(t *testing.T) {
	h := openStub(t)
	// kvd's arena is mmap'd memory, not Go's.
	arena, err := syscall.Mmap(-1, 0, 1<<20, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = syscall.Munmap(arena) }()
	if err := h.HostRegister(arena); err != nil {
		t.Fatal(err)
	}
	var he *HIPError
	if err := h.HostRegister(arena[4096:8192]); !errors.As(err, &he) || he.Name != "hipErrorHostMemoryAlreadyRegistered" {
		t.Fatalf("overlapping register: %v", err)
	}
	if err := h.HostUnregister(arena); err != nil {
		t.Fatal(err)
	}
	if err := h.HostUnregister(arena); !errors.As(err, &he) || he.Code != 713 {
		t.Fatalf("second unregister: %v", err)
	}
	if err := h.HostRegister(nil); !errors.Is(err, ErrHIPArgument) {
		t.Fatalf("empty register: %v", err)
	}
}

func TestHIPIPC(t *testing.T) {
	h := openStub(t)
	m, err := h.Malloc(8192)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h.Free(m) }()
	if err := h.CopyToDevice(m, 100, []byte("block 42")); err != nil {
		t.Fatal(err)
	}
	hd, err := h.IPCHandle(m)
	if err != nil {
		t.Fatal(err)
	}
	peer, err := h.OpenIPC(hd, m.Size())
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 8)
	if err := h.CopyFromDevice(got, peer, 100); err != nil || string(got) != "block 42" {
		t.Fatalf("read through the IPC mapping: %q, %v", got, err)
	}
	if err := h.Free(peer); !errors.Is(err, ErrHIPArgument) {
		t.Fatalf("Free of an IPC mapping: %v", err)
	}
	if err := h.CloseIPC(peer); err != nil {
		t.Fatal(err)
	}
	var bad IPCHandle
	if _, err := h.OpenIPC(bad, 8); !errors.Is(err, ErrHIP) {
		t.Fatalf("OpenIPC of a zero handle: %v", err)
	}
}

func TestOpenHIPMissing(t *testing.T) {
	if _, err := OpenHIP(filepath.Join(t.TempDir(), "libnothere.so")); !errors.Is(err, ErrHIPUnavailable) {
		t.Fatalf("OpenHIP of a missing library: %v", err)
	}
}
