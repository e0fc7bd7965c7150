package kvnats

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// StreamConfig is the INFERA_KV_EVENTS stream as the reference creates it:
// limits retention, file storage, discard old, 256 MiB, 1,000,000 messages.
func StreamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:      StreamName,
		Subjects:  []string{SubjectPrefix + ".>"},
		Retention: jetstream.LimitsPolicy,
		Storage:   jetstream.FileStorage,
		Discard:   jetstream.DiscardOld,
		MaxBytes:  256 << 20,
		MaxMsgs:   1_000_000,
	}
}

// EnsureStream creates the event stream or updates it to StreamConfig;
// relay and router both call it so neither races ahead of the other.
func EnsureStream(ctx context.Context, js jetstream.JetStream) (jetstream.Stream, error) {
	s, err := js.CreateOrUpdateStream(ctx, StreamConfig())
	if err != nil {
		return nil, fmt.Errorf("kvnats: stream %s: %w", StreamName, err)
	}
	return s, nil
}

// EnsureBucket opens the view bucket, creating it (defaults, as the
// reference) on first use.
func EnsureBucket(ctx context.Context, js jetstream.JetStream) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, ViewBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: ViewBucket})
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, ViewBucket)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("kvnats: bucket %s: %w", ViewBucket, err)
	}
	return kv, nil
}
