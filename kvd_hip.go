package main

import "github.com/prometheus/client_golang/prometheus"

// arenaHIPGauge reports whether kvd's arena is registered with the GPUs.
func arenaHIPGauge(registered bool) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "infera_kvd_arena_hip_registered",
		Help: "1 when the shared arena is registered with the GPUs (hipHostRegister; the GPU build on a node with HIP), else 0",
	}, func() float64 {
		if registered {
			return 1
		}
		return 0
	})
}
