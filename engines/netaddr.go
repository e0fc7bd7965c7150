package engines

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/rs/zerolog"

	"github.com/infera/infera/internal/freeport"
)

// portBlockAttempts bounds the search for n consecutive free ports.
const portBlockAttempts = 64

// netInterface is what advertiseHost needs to know of one interface.
type netInterface struct {
	Up, Loopback bool
	Addrs        []net.Addr
}

func systemInterfaces() ([]netInterface, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	out := make([]netInterface, 0, len(ifs))
	for _, ifc := range ifs {
		addrs, err := ifc.Addrs()
		if err != nil {
			continue // an interface that vanished meanwhile is not a candidate
		}
		out = append(out, netInterface{
			Up:       ifc.Flags&net.FlagUp != 0,
			Loopback: ifc.Flags&net.FlagLoopback != 0,
			Addrs:    addrs,
		})
	}
	return out, nil
}

// DefaultNodePortRange is Kubernetes' default --service-node-port-range.
// Any Service may claim a port in it cluster-wide at any time, and kube-proxy
// (IPVS) then owns that port on every node address: an engine listening there
// answers on loopback but is refused from the node IP it advertises. Ports the
// worker allocates keep out of it (INFERA_NODEPORT_RANGE), as the reference's
// do.
const DefaultNodePortRange = "30000-32767"

// reservedPorts is the window auto-allocated ports avoid: INFERA_NODEPORT_RANGE
// ("lo-hi"), "none" or "off" for no window; an empty or unreadable value keeps
// the default (a manifest rendering an unset variable as "" must not drop the
// guard). ok is false without a window.
func reservedPorts(lookup func(string) (string, bool)) (lo, hi int, ok bool) {
	spec := DefaultNodePortRange
	if v, set := lookup("INFERA_NODEPORT_RANGE"); set && strings.TrimSpace(v) != "" {
		spec = strings.TrimSpace(v)
	}
	if strings.EqualFold(spec, "none") || strings.EqualFold(spec, "off") {
		return 0, 0, false
	}
	if lo, hi, ok := parsePortRange(spec); ok {
		return lo, hi, true
	}
	lo, hi, _ = parsePortRange(DefaultNodePortRange)
	return lo, hi, true
}

func parsePortRange(s string) (int, int, bool) {
	a, b, found := strings.Cut(s, "-")
	lo, err1 := strconv.Atoi(strings.TrimSpace(a))
	hi, err2 := strconv.Atoi(strings.TrimSpace(b))
	if !found || err1 != nil || err2 != nil || lo < 0 || hi < lo || hi > 65535 {
		return 0, 0, false
	}
	return lo, hi, true
}

// freePortBlock asks the kernel for a free TCP port on host and checks that
// the n-1 ports after it are free too (engines put data-parallel rank r on
// base port + r). A block touching the NodePort window (reservedPorts) is
// not taken; when the kernel keeps handing out ports there (a host whose
// ephemeral range overlaps it), random blocks below the window are tried.
// Another process can take a port before the engine binds it; the engine
// then fails to start, which the worker reports, rather than serving on an
// unexpected port.
func freePortBlock(host string, n int) (int, error) {
	return freePortBlockOutside(host, n, os.LookupEnv)
}

func freePortBlockOutside(host string, n int, lookup func(string) (string, bool)) (int, error) {
	if n < 1 {
		return 0, fmt.Errorf("find free ports on %q: want at least one, got %d", host, n)
	}
	lo, hi, guard := reservedPorts(lookup)
	reserved := func(base int) bool { return guard && base+n-1 >= lo && base <= hi }
	var lastErr error
	for range portBlockAttempts {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return 0, fmt.Errorf("find free port on %q: %w", host, err)
		}
		base := l.Addr().(*net.TCPAddr).Port
		if reserved(base) {
			_ = l.Close()
			lastErr = fmt.Errorf("port %d is in the NodePort range %d-%d (INFERA_NODEPORT_RANGE)", base, lo, hi)
			break
		}
		if ok, err := holdBlock(host, base, n, l); ok {
			if freeport.Claim(base, n) {
				return base, nil
			}
			lastErr = fmt.Errorf("port %d was handed out to an engine moments ago", base)
		} else if err != nil {
			lastErr = err
		}
	}
	if guard && lo-n >= 1024 && lastErr != nil {
		for range portBlockAttempts {
			var r [2]byte
			_, _ = rand.Read(r[:])
			base := 1024 + int(uint16(r[0])<<8|uint16(r[1]))%(lo-n-1024+1)
			if ok, err := holdBlock(host, base, n, nil); ok && freeport.Claim(base, n) {
				return base, nil
			} else if err != nil {
				lastErr = err
			}
		}
	}
	return 0, fmt.Errorf("find %d consecutive free ports on %q: gave up after %d attempts (last: %v)", n, host, portBlockAttempts, lastErr)
}

// holdBlock checks that ports base..base+n-1 are free on host (first, when
// not nil, already listens on base) and releases them.
func holdBlock(host string, base, n int, first net.Listener) (bool, error) {
	var held []net.Listener
	if first != nil {
		held = append(held, first)
	}
	var lastErr error
	ok := base+n-1 <= 65535
	for p := base + len(held); ok && p < base+n; p++ {
		ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(p)))
		if err != nil {
			lastErr, ok = err, false
			break
		}
		held = append(held, ln)
	}
	for _, ln := range held {
		if err := ln.Close(); err != nil && lastErr == nil {
			lastErr = err
		}
	}
	return ok, lastErr
}

// isUnspecified reports whether host binds every interface. Empty counts:
// vLLM binds every interface when --host is left out.
func isUnspecified(host string) bool {
	if host == "" || host == "*" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsUnspecified()
}

// advertiseHost is the host other machines reach the engine at: the flag,
// else the engine's bind host, else (the engine binds every interface) the
// first non-loopback IPv4 address of an up interface, else its first global
// IPv6 address.
func advertiseHost(flag, bind string, interfaces func() ([]netInterface, error)) (string, error) {
	if flag != "" {
		return flag, nil
	}
	if !isUnspecified(bind) {
		return bind, nil
	}
	if interfaces == nil {
		interfaces = systemInterfaces
	}
	ifs, err := interfaces()
	if err != nil {
		return "", fmt.Errorf("%w: engine binds every interface: list interfaces (set --advertise-host): %w", ErrAdvertiseHost, err)
	}
	var v6 string
	for _, ifc := range ifs {
		if !ifc.Up || ifc.Loopback {
			continue
		}
		for _, a := range ifc.Addrs {
			var ip net.IP
			switch a := a.(type) {
			case *net.IPNet:
				ip = a.IP
			case *net.IPAddr:
				ip = a.IP
			}
			// Link-local addresses are not routable beyond the link; an
			// advertised one would reach nothing.
			if ip == nil || ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsUnspecified() || ip.IsMulticast() {
				continue
			}
			if ip.To4() != nil {
				return ip.String(), nil
			}
			if v6 == "" && ip.IsGlobalUnicast() {
				v6 = ip.String()
			}
		}
	}
	if v6 != "" {
		return v6, nil
	}
	return "", fmt.Errorf("%w: engine binds every interface and this machine has no routable address: set --advertise-host", ErrAdvertiseHost)
}

// localHost is the address the worker uses to reach its own engine.
func localHost(bind string) string {
	ip := net.ParseIP(bind)
	switch {
	case bind == "" || bind == "*":
		return "127.0.0.1"
	case ip == nil || !ip.IsUnspecified():
		return bind
	case ip.To4() != nil:
		return "127.0.0.1"
	default:
		return "::1"
	}
}

// warnLoopbackAdvertise flags a record other hosts could not use: a loopback
// address registered in an etcd that lives on another machine.
func warnLoopbackAdvertise(log zerolog.Logger, adv string, endpoints []string) {
	if !isLoopback(adv) {
		return
	}
	for _, ep := range endpoints {
		host := ep
		if u, err := url.Parse(ep); err == nil && u.Host != "" {
			host = u.Host
		}
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		if !isLoopback(host) {
			log.Warn().Str("advertise_host", adv).Str("etcd_endpoint", ep).
				Msg("advertising a loopback address to a remote etcd; other hosts cannot reach this engine (set --advertise-host)")
			return
		}
	}
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// hostPort formats host:port (IPv6 hosts in brackets).
func hostPort(host string, port int) string { return net.JoinHostPort(host, strconv.Itoa(port)) }

// tcpEndpoint formats a ZMQ tcp endpoint.
func tcpEndpoint(host string, port int) string { return "tcp://" + hostPort(host, port) }

// randomHex returns n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (it panics instead)
	return hex.EncodeToString(b)
}
