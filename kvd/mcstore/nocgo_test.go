//go:build !mooncake || !cgo

package mcstore_test

import (
	"errors"
	"testing"

	"github.com/infera/infera/kvd/mcstore"
)

// TestUnavailableWithoutTag: a default build says why it has no Mooncake
// Store rather than failing later.
func TestUnavailableWithoutTag(t *testing.T) {
	_, err := mcstore.Open(mcstore.Config{MasterAddress: "m:50051", LocalHostname: "h:14001"})
	if !errors.Is(err, mcstore.ErrUnavailable) || !containsStr(err.Error(), "mooncake tag") {
		t.Fatalf("%v", err)
	}
}
