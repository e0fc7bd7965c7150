package l4

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisRemote is the Remote on Redis/Valkey: github.com/redis/go-redis/v9,
// standalone or cluster behind one UniversalClient.
type redisRemote struct {
	rdb redis.UniversalClient
}

// openRedis builds the client for redis:// or rediss:// URLs (one is a
// standalone server, several are one cluster's seed nodes).
func openRedis(urls []string) (*redisRemote, error) {
	if len(urls) == 0 {
		return nil, errors.Join(ErrConfig, errors.New("no redis URL"))
	}
	setLogger.Do(func() { redis.SetLogger(quietLogger{}) })
	first, err := redis.ParseURL(urls[0])
	if err != nil {
		return nil, fmt.Errorf("l4 url %q: %w", urls[0], errors.Join(ErrConfig, err))
	}
	addrs := []string{first.Addr}
	for _, u := range urls[1:] {
		o, err := redis.ParseURL(u)
		if err != nil {
			return nil, fmt.Errorf("l4 url %q: %w", u, errors.Join(ErrConfig, err))
		}
		addrs = append(addrs, o.Addr)
	}
	var tlsCfg *tls.Config
	if first.TLSConfig != nil {
		tlsCfg = first.TLSConfig
	}
	return &redisRemote{rdb: redis.NewUniversalClient(&redis.UniversalOptions{
		Addrs: addrs, DB: first.DB, Username: first.Username, Password: first.Password, TLSConfig: tlsCfg,
		IsClusterMode: len(addrs) > 1, Protocol: 2, DisableIdentity: true, ContextTimeoutEnabled: true,
		DialTimeout: 500 * time.Millisecond, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second,
		MaxRetries: 1, PoolSize: 16,
	})}, nil
}

func (r *redisRemote) Name() string { return "redis" }

func (r *redisRemote) Ping(ctx context.Context) error { return r.rdb.Ping(ctx).Err() }

// Write pipelines the batch: SET with the TTL, DEL for deletes.
func (r *redisRemote) Write(ctx context.Context, batch []Op, ttl time.Duration) error {
	_, err := r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, o := range batch {
			if o.Val == nil {
				p.Del(ctx, o.Key)
			} else {
				p.Set(ctx, o.Key, o.Val, ttl)
			}
		}
		return nil
	})
	return err
}

func (r *redisRemote) Get(ctx context.Context, key string) ([]byte, error) {
	b, err := r.rdb.Get(ctx, key).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, ErrRemoteMiss
	}
	return b, err
}

func (r *redisRemote) Exists(ctx context.Context, key string) (bool, error) {
	n, err := r.rdb.Exists(ctx, key).Result()
	return n > 0, err
}

// Outage: anything but a miss or a Redis error reply (a network error, a
// timeout) means Redis cannot be reached.
func (r *redisRemote) Outage(err error) bool {
	if err == nil || errors.Is(err, redis.Nil) {
		return false
	}
	var re redis.Error
	return !errors.As(err, &re) || errors.Is(err, context.DeadlineExceeded)
}

func (r *redisRemote) Close() error { return r.rdb.Close() }

// quietLogger replaces go-redis's own stderr logging (one line per failed
// dial during an outage); the tier logs the outage once itself.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

var setLogger sync.Once
