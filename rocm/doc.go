// Package rocm knows the node a worker runs on: its AMD GPUs, read from the
// KFD topology (/sys/class/kfd/kfd/topology), its RDMA devices, ports and
// GIDs (/sys/class/infiniband), and which NIC sits next to which GPU on the
// PCIe tree or NUMA node (/sys/bus/pci/devices). Everything is read below an
// injectable sysfs root, so tests and `infera worker --preflight
// --sysfs-root` run on fixture trees (testdata/). Every file's content is
// outside input: it is parsed strictly and a malformed entry becomes an
// error that names the file, never a panic.
//
// Preflight turns what Discover found, the worker's role and its advertised
// address into findings and a verdict: a prefill or decode worker without an
// active RDMA port, or advertising an address other hosts cannot reach,
// would silently move KV over TCP, ~100x slower, so that is blocking unless
// TCP is explicitly allowed.
//
// With build tag rocm (cgo), OpenHIP loads the HIP runtime (libamdhip64)
// with dlopen and gives the few calls Infera needs for HBM and pinned host
// memory: device count and properties, hipMalloc/hipFree, hipMemcpy between
// host and device, hipHostRegister/hipHostUnregister (kvd's arena) and IPC
// memory handles. Its C declarations are written from HIP's public API; the
// tests build testdata/hipstub, a C library with the same ABI that emulates
// device memory in host memory and fails on demand. The untagged files are
// pure Go, so the default build stays CGO_ENABLED=0.
//
// Concurrency: Discover and Preflight are pure functions of their inputs
// (and the files they read); the values they return are not shared and may
// be used from any goroutine. A HIP may be used from any goroutine; Close
// comes after every other call.
package rocm
