package l4

import (
	"context"
	"errors"
	"time"

	"github.com/infera/infera/kvd/mcstore"
)

// mooncakeRemote is the Remote on Mooncake Store (kvd/mcstore): the
// Python fleet's `--long-backend mooncake`. Mooncake has no TTLs (its
// master evicts by its own policy) and its C calls take no deadline, so a
// read waits for the store's own RPC timeout.
type mooncakeRemote struct {
	st *mcstore.Store
}

// OpenMooncake connects to Mooncake Store and starts a tier over it. A
// store that cannot be set up (library missing, master refusing) is an
// error: the operator asked for it explicitly.
func OpenMooncake(opt Options, cfg mcstore.Config) (*Tier, error) {
	st, err := mcstore.Open(cfg)
	if err != nil {
		return nil, err
	}
	return OpenRemote(opt, &mooncakeRemote{st: st})
}

func (m *mooncakeRemote) Name() string { return "mooncake" }

func (m *mooncakeRemote) Ping(context.Context) error { return m.st.Healthy() }

func (m *mooncakeRemote) Write(_ context.Context, batch []Op, _ time.Duration) error {
	var errs []error
	for _, o := range batch {
		var err error
		if o.Val == nil {
			err = m.st.Remove(o.Key)
		} else {
			err = m.st.Put(o.Key, o.Val)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (m *mooncakeRemote) Get(_ context.Context, key string) ([]byte, error) {
	b, err := m.st.Get(key, nil)
	if errors.Is(err, mcstore.ErrNotFound) {
		return nil, ErrRemoteMiss
	}
	return b, err
}

func (m *mooncakeRemote) Exists(_ context.Context, key string) (bool, error) {
	return m.st.Exists(key)
}

// Outage: a store error code (RPC failure, master gone) means the pool
// cannot be reached; a miss does not.
func (m *mooncakeRemote) Outage(err error) bool {
	return err != nil && !errors.Is(err, mcstore.ErrNotFound)
}

func (m *mooncakeRemote) Close() error { return m.st.Close() }
