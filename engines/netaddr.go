package engines

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"strconv"

	"github.com/rs/zerolog"
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

// freePortBlock asks the kernel for a free TCP port on host and checks that
// the n-1 ports after it are free too (engines put data-parallel rank r on
// base port + r). Another process can take a port before the engine binds
// it; the engine then fails to start, which the worker reports, rather than
// serving on an unexpected port.
func freePortBlock(host string, n int) (int, error) {
	if n < 1 {
		return 0, fmt.Errorf("find free ports on %q: want at least one, got %d", host, n)
	}
	var lastErr error
	for range portBlockAttempts {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return 0, fmt.Errorf("find free port on %q: %w", host, err)
		}
		base := l.Addr().(*net.TCPAddr).Port
		held := []net.Listener{l}
		ok := base+n-1 <= 65535
		for p := base + 1; ok && p < base+n; p++ {
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
		if ok {
			return base, nil
		}
	}
	return 0, fmt.Errorf("find %d consecutive free ports on %q: gave up after %d attempts (last: %v)", n, host, portBlockAttempts, lastErr)
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
