package engines

import (
	"fmt"
	"io"

	"github.com/rs/zerolog"

	"github.com/infera/infera/config"
	"github.com/infera/infera/discovery"
	"github.com/infera/infera/rocm"
)

// isPD reports whether a worker's engine moves KV to or from another host.
func isPD(mode discovery.DisaggMode) bool {
	return mode == discovery.DisaggPrefill || mode == discovery.DisaggDecode
}

// pdReport reads the node below --sysfs-root and judges the worker's role
// and advertised host on it.
func pdReport(cfg config.Worker, role, advertise string) (rocm.Report, error) {
	node, err := rocm.Discover(cfg.SysfsRoot)
	if err != nil {
		return rocm.Report{}, fmt.Errorf("preflight: read the node below %s: %w", cfg.SysfsRoot, err)
	}
	return rocm.Preflight(node, rocm.PreflightInput{
		SysfsRoot: cfg.SysfsRoot, Role: role, AdvertiseHost: advertise, AllowTCP: cfg.AllowTCP,
	}), nil
}

// checkPD is the gate before a prefill or decode worker starts its engine:
// it returns an error wrapping rocm.ErrPreflight when KV would move over TCP
// or to an unreachable address, unless --disaggregation-allow-tcp, and logs
// every warning.
func checkPD(cfg config.Worker, ep Endpoint, log zerolog.Logger) error {
	rep, err := pdReport(cfg, string(ep.DisaggMode), ep.AdvertiseHost)
	if err != nil {
		if cfg.AllowTCP {
			log.Warn().Err(err).Msg("PD preflight could not read the node; continuing as --disaggregation-allow-tcp is set")
			return nil
		}
		return fmt.Errorf("%w: %w", rocm.ErrPreflight, err)
	}
	for _, f := range rep.Findings {
		if f.Severity == rocm.SeverityWarn {
			log.Warn().Str("code", f.Code).Msg(f.Message)
		}
	}
	if err := rep.Err(); err != nil {
		return err
	}
	log.Info().Str("verdict", rep.Verdict).Int("gpus", len(rep.Node.GPUs)).Int("rdma_devices", len(rep.Node.NICs)).Msg("PD preflight passed")
	return nil
}

// Preflight is `infera worker --preflight`: it prepares the engine's launch
// without starting it (for the role and the advertised host; without
// --engine the node alone is judged as for a prefill or decode worker),
// writes the findings to out as text or JSON and returns an error wrapping
// rocm.ErrPreflight on a blocking finding.
func Preflight(cfg config.Worker, out io.Writer) error {
	return preflight(cfg, out, Options{})
}

func preflight(cfg config.Worker, out io.Writer, seams Options) error {
	role, advertise := rocm.RoleAnyPD, cfg.AdvertiseHost
	if cfg.Engine != "" {
		adapter, err := Lookup(cfg.Engine)
		if err != nil {
			return fmt.Errorf("preflight: %w", err)
		}
		opts := seams
		opts.Bin, opts.Python, opts.AdvertiseHost, opts.NoKVEvents = cfg.EngineBin, cfg.Python, cfg.AdvertiseHost, cfg.NoKVEvents
		if opts.Bin == "" {
			opts.Bin = cfg.Engine // not run: any name will do
		}
		launch, err := adapter.Prepare(opts, cfg.EngineArgs)
		if err != nil {
			return fmt.Errorf("preflight: %w", err)
		}
		role, advertise = string(launch.Endpoint.DisaggMode), launch.Endpoint.AdvertiseHost
		if role == "" {
			role = string(discovery.DisaggMixed)
		}
	} else if advertise == "" {
		// What a worker binding every interface would advertise; none is
		// itself a finding.
		advertise, _ = advertiseHost("", "", seams.interfaces)
	}
	rep, err := pdReport(cfg, role, advertise)
	if err != nil {
		return err
	}
	if cfg.JSON {
		err = rep.WriteJSON(out)
	} else {
		err = rep.WriteText(out)
	}
	if err != nil {
		return fmt.Errorf("preflight: write report: %w", err)
	}
	return rep.Err()
}
