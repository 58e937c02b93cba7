package redisstore

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"

	"github.com/redis/go-redis/v9"
)

// follow makes a Cluster client reload the cluster's layout after err, when
// err says that a node is gone or that the cluster is changing, and reports
// whether it did. A master killed by a failover sends no MOVED, and without
// a reload the client keeps sending its slots' commands to the dead address
// until its periodic reload (ClusterStateReloadInterval, 60 s by default),
// long after a replica was promoted. The client coalesces reloads, so a
// burst of failures costs one CLUSTER SLOTS every 200 ms at most.
func (s *Store) follow(err error) bool {
	if s.cluster == nil || err == nil || !nodeGone(err) {
		return false
	}
	s.cluster.ReloadState(context.Background())
	return true
}

// nodeGone reports whether err is a refused, cut or timed-out connection,
// or a reply by which Redis says that the cluster's layout is changing.
func nodeGone(err error) bool {
	for _, prefix := range []string{"CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN", "LOADING", "READONLY"} {
		if redis.HasErrorPrefix(err, prefix) {
			return true
		}
	}
	var netErr net.Error
	return errors.As(err, &netErr) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}
