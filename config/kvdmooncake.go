package config

import (
	"bytes"
	"encoding/json"
	"os"

	"sigs.k8s.io/yaml"
)

// Long backends: where kvd's long entries go below RAM.
const (
	// LongBackendTablespace: the local L3 tablespace (--long-path), with
	// the Redis L4 below it when --l4-redis is set.
	LongBackendTablespace = "tablespace"
	// LongBackendMooncake: L4 on Mooncake Store (below the tablespace when
	// --long-path is set too: a composed L3+L4 pool).
	LongBackendMooncake = "mooncake"
)

// MooncakeL4 is kvd's Mooncake Store L4, from --mooncake-config (YAML, the
// Python fleet's keys) and INFERA_L4_* variables, which win over the file
// as the reference has it (per-pod values such as POD_IP cannot live in a
// shared ConfigMap).
type MooncakeL4 struct {
	Library           string `json:"library"`
	MasterAddress     string `json:"master_address"`
	ClusterID         string `json:"cluster_id"`
	MetadataServer    string `json:"metadata_server"`
	Protocol          string `json:"protocol"`
	DeviceName        string `json:"device_name"`
	LocalHostname     string `json:"local_hostname"`
	GlobalSegmentSize uint64 `json:"global_segment_size"`
	LocalBufferSize   uint64 `json:"local_buffer_size"`
	MaxValueBytes     int64  `json:"max_value_bytes"`
}

// mooncakeEnv maps each setting to its INFERA_L4_ suffix.
var mooncakeEnv = []struct {
	suffix string
	str    func(m *MooncakeL4) *string
	num    func(m *MooncakeL4) *uint64
}{
	{"LIBRARY", func(m *MooncakeL4) *string { return &m.Library }, nil},
	{"MASTER_ADDRESS", func(m *MooncakeL4) *string { return &m.MasterAddress }, nil},
	{"CLUSTER_ID", func(m *MooncakeL4) *string { return &m.ClusterID }, nil},
	{"METADATA_SERVER", func(m *MooncakeL4) *string { return &m.MetadataServer }, nil},
	{"PROTOCOL", func(m *MooncakeL4) *string { return &m.Protocol }, nil},
	{"DEVICE_NAME", func(m *MooncakeL4) *string { return &m.DeviceName }, nil},
	{"LOCAL_HOSTNAME", func(m *MooncakeL4) *string { return &m.LocalHostname }, nil},
	{"GLOBAL_SEGMENT_SIZE", nil, func(m *MooncakeL4) *uint64 { return &m.GlobalSegmentSize }},
	{"LOCAL_BUFFER_SIZE", nil, func(m *MooncakeL4) *uint64 { return &m.LocalBufferSize }},
}

// LoadMooncakeL4 reads the YAML file (empty path: none), applies the
// INFERA_L4_* variables (getenv, normally os.Getenv) and the defaults, and
// checks what is required; every problem is reported.
func LoadMooncakeL4(path string, getenv func(string) string) (MooncakeL4, error) {
	var p Problems
	m := loadMooncakeL4(&p, path, getenv)
	return m, p.Err()
}

func loadMooncakeL4(p *Problems, path string, getenv func(string) string) MooncakeL4 {
	m := MooncakeL4{}
	if path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			p.Addf("--mooncake-config: %v", err)
			return m
		}
		js, err := yaml.YAMLToJSON(b)
		if err == nil {
			dec := json.NewDecoder(bytes.NewReader(js))
			dec.DisallowUnknownFields()
			err = dec.Decode(&m)
		}
		if err != nil {
			p.Addf("--mooncake-config %s: %v", path, err)
			return m
		}
	}
	for _, e := range mooncakeEnv {
		v := getenv("INFERA_L4_" + e.suffix)
		if v == "" {
			continue
		}
		if e.str != nil {
			*e.str(&m) = v
			continue
		}
		n, err := ParseBytes(v)
		if err != nil || n <= 0 {
			p.Addf("INFERA_L4_%s %q: want a positive size", e.suffix, v)
			continue
		}
		*e.num(&m) = uint64(n)
	}
	if v := getenv("INFERA_L4_MAX_VALUE_BYTES"); v != "" {
		if n, err := ParseBytes(v); err == nil && n > 0 {
			m.MaxValueBytes = n
		} else {
			p.Addf("INFERA_L4_MAX_VALUE_BYTES %q: want a positive size", v)
		}
	}
	if m.LocalHostname == "" {
		// In Kubernetes the pod's routable address comes from the
		// downward API; a bare hostname is not routable there.
		if ip := getenv("POD_IP"); ip != "" {
			port := getenv("INFERA_L4_LOCAL_PORT")
			if port == "" {
				port = "14001"
			}
			m.LocalHostname = ip + ":" + port
		}
	}
	if m.Protocol == "" {
		m.Protocol = "tcp"
	}
	if m.MetadataServer == "" {
		m.MetadataServer = "P2PHANDSHAKE"
	}
	if m.GlobalSegmentSize == 0 {
		m.GlobalSegmentSize = 1 << 30
	}
	if m.LocalBufferSize == 0 {
		m.LocalBufferSize = 1 << 28
	}
	if m.MaxValueBytes == 0 {
		m.MaxValueBytes = 64 << 20
	}
	if m.MasterAddress == "" {
		p.Addf("mooncake: master_address is required (--mooncake-config or INFERA_L4_MASTER_ADDRESS)")
	}
	if m.ClusterID == "" {
		p.Addf("mooncake: cluster_id is required (--mooncake-config or INFERA_L4_CLUSTER_ID): it namespaces this fleet's keys")
	}
	if m.LocalHostname == "" {
		p.Addf("mooncake: local_hostname (a routable host:port) is required (--mooncake-config, INFERA_L4_LOCAL_HOSTNAME, or POD_IP)")
	}
	if m.Protocol == "rdma" && m.DeviceName == "" && getenv("INFERA_L4_ALLOW_TCP_FALLBACK") != "1" {
		p.Addf("mooncake: protocol rdma needs device_name (e.g. mlx5_0), or Mooncake silently uses TCP; set INFERA_L4_ALLOW_TCP_FALLBACK=1 to allow that")
	}
	return m
}
