package natsx_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/infera/infera/internal/natstest"
	"github.com/infera/infera/internal/testkit"
	"github.com/infera/infera/natsx"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestConnectCredentials: credentials in the URL are used; a server that
// refuses them, or none, is one ErrConnect at once.
func TestConnectCredentials(t *testing.T) {
	s := natstest.Start(t, "--user", "infera", "--pass", "s3cret")
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	nc, err := natsx.Connect(ctx, natsx.Config{URL: "nats://infera:s3cret@" + s.Addr}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
	for _, url := range []string{"nats://infera:wrong@" + s.Addr, "nats://" + s.Addr} {
		_, err := natsx.Connect(ctx, natsx.Config{URL: url}, zerolog.Nop())
		if !errors.Is(err, natsx.ErrConnect) || !strings.Contains(strings.ToLower(err.Error()), "authorization") {
			t.Errorf("%s: %v, want an authorization ErrConnect", natsx.Redacted(url), err)
		}
		if err != nil && strings.Contains(err.Error(), "wrong") {
			t.Errorf("the error shows the password: %v", err)
		}
	}
	// Nothing listening: refused at once.
	port := testkit.FreePort(t)
	if _, err := natsx.Connect(ctx, natsx.Config{URL: "nats://127.0.0.1:" + strconv.Itoa(port)}, zerolog.Nop()); !errors.Is(err, natsx.ErrConnect) {
		t.Errorf("no server: %v", err)
	}
	// A token in the URL.
	tok := natstest.Start(t, "--auth", "tok123")
	nc, err = natsx.Connect(ctx, natsx.Config{URL: "nats://tok123@" + tok.Addr}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
}

func TestTokenGolden(t *testing.T) {
	if natsx.Token("10.0.0.1:8080") != "MTAuMC4wLjE6ODA4MA" {
		t.Fatal(natsx.Token("10.0.0.1:8080"))
	}
	if id, err := natsx.DecodeToken("MTAuMC4wLjE6ODA4MA"); err != nil || id != "10.0.0.1:8080" {
		t.Fatal(id, err)
	}
	if _, err := natsx.DecodeToken("_w"); !errors.Is(err, natsx.ErrBadToken) {
		t.Fatal(err)
	}
}
