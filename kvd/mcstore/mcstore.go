package mcstore

import "errors"

// Sentinel errors.
var (
	// ErrUnavailable: the library cannot be loaded (or the binary was
	// built without the mooncake tag).
	ErrUnavailable = errors.New("mcstore: mooncake store unavailable")
	// ErrNotFound: no object under the key.
	ErrNotFound = errors.New("mcstore: not found")
	// ErrTooLarge: the object does not fit the buffer given to Get.
	ErrTooLarge = errors.New("mcstore: object larger than the buffer")
	// ErrStore: Mooncake Store answered with an error code.
	ErrStore = errors.New("mcstore: store error")
	// ErrConfig: invalid Config.
	ErrConfig = errors.New("mcstore: invalid config")
)

// Config is what mooncake_store_setup takes, with Infera's names (the
// Python fleet's --mooncake-config keys and INFERA_L4_* variables).
type Config struct {
	// Library is the shared library to load (default
	// "libmooncake_store.so", found through the dynamic loader's path).
	Library string
	// LocalHostname is this client's routable host:port (its segment).
	LocalHostname string
	// MetadataServer is the metadata connection string ("P2PHANDSHAKE",
	// http://…, etcd://…).
	MetadataServer string
	// MasterAddress is the master service's host:port.
	MasterAddress string
	// GlobalSegmentSize is the memory this client contributes to the
	// pool; LocalBufferSize its transfer buffer.
	GlobalSegmentSize uint64
	LocalBufferSize   uint64
	// Protocol ("tcp", "rdma") and DeviceName (RDMA NICs).
	Protocol   string
	DeviceName string
	// Replicas per object (default 1).
	Replicas int
}

func (c *Config) defaults() error {
	if c.Library == "" {
		c.Library = "libmooncake_store.so"
	}
	if c.Protocol == "" {
		c.Protocol = "tcp"
	}
	if c.MetadataServer == "" {
		c.MetadataServer = "P2PHANDSHAKE"
	}
	if c.GlobalSegmentSize == 0 {
		c.GlobalSegmentSize = 1 << 30
	}
	if c.LocalBufferSize == 0 {
		c.LocalBufferSize = 1 << 28
	}
	if c.Replicas <= 0 {
		c.Replicas = 1
	}
	var missing []error
	if c.MasterAddress == "" {
		missing = append(missing, errors.New("master_address is required"))
	}
	if c.LocalHostname == "" {
		missing = append(missing, errors.New("local_hostname (host:port) is required"))
	}
	if len(missing) > 0 {
		return errors.Join(append([]error{ErrConfig}, missing...)...)
	}
	return nil
}

// StoreError is ErrStore with the operation and Mooncake's code.
type StoreError struct {
	Op   string
	Code int64
}

func (e *StoreError) Error() string {
	return "mcstore: " + e.Op + ": mooncake error " + itoa(e.Code)
}

// Unwrap makes errors.Is(err, ErrStore) true.
func (e *StoreError) Unwrap() error { return ErrStore }

func itoa(n int64) string {
	if n == 0 {
		return "0"
	}
	neg := n < 0
	if neg {
		n = -n
	}
	var b [20]byte
	i := len(b)
	for n > 0 {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
	}
	if neg {
		i--
		b[i] = '-'
	}
	return string(b[i:])
}
