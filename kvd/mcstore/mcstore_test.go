package mcstore_test

import (
	"errors"
	"testing"

	"github.com/infera/infera/kvd/mcstore"
)

// TestConfigChecked: master address and local host:port are required, in
// every build, and the error names them.
func TestConfigChecked(t *testing.T) {
	_, err := mcstore.Open(mcstore.Config{})
	if !errors.Is(err, mcstore.ErrConfig) {
		t.Fatalf("empty config: %v", err)
	}
	for _, want := range []string{"master_address", "local_hostname"} {
		if !containsStr(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
}

func containsStr(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}
