package natsops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/jsm.go/api"
	"github.com/nats-io/nats.go"
)

// The switch of a replicated stream's subject transform.
//
// NATS applies a stream's subject transform when each replica applies a
// row to its own store, and a new transform reaches each replica through
// the meta group, not through the stream's own log. Changed in place while
// rows arrive, the transform can route a row stored around the change one
// way on one replica and the other way on another (nats-server 2.15.2, an
// R3 stream, V 16 -> 12: 2-8 rows of ~240 around the change stored under
// two subjects in every run;
// TestAnInPlaceTransformChangeCanStoreARowUnderTwoSubjects). A consumer
// reads its own leader's store: two units' consumers then both deliver
// the row (two owners process it), or neither does (it is never
// delivered). So, for a stream with more than one replica, the transform
// is changed with the stream's input paused:
//
//  1. pause: the stream's subjects become pausedSubject, which nobody
//     publishes to (the transform stays as it is): the leader takes no
//     new row, publishers get no responders and retry;
//  2. settle: every replica server reports (its own JSZ) the leader's last
//     sequence, twice in a row, so every row taken before the pause was
//     applied everywhere under the old transform;
//  3. change the transform (the input still paused);
//  4. confirm: every replica server reports the new transform, so it
//     applies every later row with it (a server sets the transform before
//     the configuration JSZ reports);
//  5. resume: the input subject comes back.
//
// It pauses only while every replica is current (a replica already
// offline would hold the pause); every step is idempotent and the state
// is the stream's own config: a stream found paused (an operator that
// died mid-switch) resumes at 2.
// Publishers see no responders from 1 to 5 (70-120 ms on a healthy
// 3-server cluster); a replica that does not report keeps the input
// paused until it does, or until a later reconcile finds it: order and
// single delivery come before availability here.

// ErrSwitchNeedsSystem means a replicated stream's transform must change
// and no system-account connection was given to confirm its replicas.
var ErrSwitchNeedsSystem = errors.New("changing the subject transform of a replicated stream needs a system-account connection (spec.nats.systemCredentialsSecretRef) to confirm every replica")

// ProvisionOptions are what Provision needs beyond the application
// connection for some changes.
type ProvisionOptions struct {
	// System is a system-account connection. Under AssignByTransform it
	// confirms, through each replica server's JSZ, the steps of a change
	// of a replicated stream's transform; without it such a change is
	// refused with ErrSwitchNeedsSystem (R1 streams change in place).
	System *nats.Conn
}

// switchPoll is how often the switch looks at the replicas again.
const switchPoll = 50 * time.Millisecond

// pausedSubject is the only subject of partition p's stream while its
// transform changes: inside the topology's prefix, and matched by no
// publisher.
func (l Layout) pausedSubject(p int) string {
	return fmt.Sprintf("%s.switching.%d", l.SubjectPrefix, p)
}

// paused says whether a stream's subjects are those of a switch under way.
func (l Layout) paused(p int, got api.StreamConfig) bool {
	return len(got.Subjects) == 1 && got.Subjects[0] == l.pausedSubject(p)
}

// switchTransform changes partition p's stream, whose configuration is
// got, to want's subject transform as the package comment describes, and
// returns the stream's configuration afterwards.
func switchTransform(ctx context.Context, jsa jsAPI, o ProvisionOptions, l Layout, p int, got api.StreamConfig) (api.StreamConfig, error) {
	want := l.StreamConfig(p)
	name := want.Name
	if o.System == nil {
		return got, fmt.Errorf("stream %s: %w", name, ErrSwitchNeedsSystem)
	}
	account, err := accountName(ctx, jsa.nc)
	if err != nil {
		return got, fmt.Errorf("stream %s: %w", name, err)
	}
	cfg := got
	if !l.paused(p, cfg) {
		// A replica already behind or offline would hold the pause for
		// as long as it stays so: wait, with the input flowing, instead.
		if lagging, err := laggingReplicas(ctx, jsa, name); err != nil || len(lagging) > 0 {
			return got, fmt.Errorf("stream %s: its transform switch waits, the input still flowing: %w", name, errors.Join(err, replicasError(lagging)))
		}
		cfg.Subjects = []string{l.pausedSubject(p)}
		if err := jsa.updateStream(ctx, cfg); err != nil {
			return got, fmt.Errorf("pause the input of stream %s for its transform switch: %w", name, err)
		}
	}
	if err := settled(ctx, jsa, o.System, account, name); err != nil {
		return cfg, fmt.Errorf("stream %s paused for its transform switch: %w", name, err)
	}
	if !sameTransform(cfg.SubjectTransform, want.SubjectTransform) {
		cfg.SubjectTransform = want.SubjectTransform
		if err := jsa.updateStream(ctx, cfg); err != nil {
			return cfg, fmt.Errorf("change the transform of paused stream %s: %w", name, err)
		}
	}
	if err := replicasReport(ctx, jsa, o.System, account, name, "the new transform", func(d jszStream) bool {
		return d.Config != nil && sameTransform(d.Config.SubjectTransform, want.SubjectTransform)
	}); err != nil {
		return cfg, fmt.Errorf("stream %s paused for its transform switch: %w", name, err)
	}
	cfg.Subjects = want.Subjects
	if err := jsa.updateStream(ctx, cfg); err != nil {
		return cfg, fmt.Errorf("resume the input of stream %s after its transform switch: %w", name, err)
	}
	return cfg, nil
}

// settled waits until every replica of stream reports the leader's last
// sequence twice in a row (the input is paused: it no longer moves).
func settled(ctx context.Context, jsa jsAPI, sys *nats.Conn, account, stream string) error {
	var last uint64
	agreed := 0
	return replicasReport(ctx, jsa, sys, account, stream, "every row taken before the pause", func(d jszStream) bool {
		return true
	}, func(info *api.StreamInfo, got map[string]jszStream) bool {
		for _, d := range got {
			if d.State.LastSeq != info.State.LastSeq {
				agreed = 0
				return false
			}
		}
		if info.State.LastSeq == last {
			agreed++
		} else {
			last, agreed = info.State.LastSeq, 1
		}
		return agreed >= 2
	})
}

// replicasReport polls until every server hosting stream (its leader and
// replicas, from the stream's info) reports it in its own JSZ with ok
// true, and every extra condition holds; it names who did not, when ctx
// ends first.
func replicasReport(ctx context.Context, jsa jsAPI, sys *nats.Conn, account, stream string, what string,
	ok func(jszStream) bool, also ...func(*api.StreamInfo, map[string]jszStream) bool) error {
	for {
		missing, err := replicasLacking(ctx, jsa, sys, account, stream, ok, also)
		if err == nil && len(missing) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			if err != nil {
				return fmt.Errorf("waiting for every replica to hold %s: %w", what, err)
			}
			return fmt.Errorf("waiting for every replica to hold %s: %s did not report it: %w", what, strings.Join(missing, ", "), ctx.Err())
		case <-time.After(switchPoll):
		}
	}
}

// replicasLacking lists the servers hosting stream whose JSZ does not
// show ok, or all of them when an extra condition fails.
func replicasLacking(ctx context.Context, jsa jsAPI, sys *nats.Conn, account, stream string,
	ok func(jszStream) bool, also []func(*api.StreamInfo, map[string]jszStream) bool) ([]string, error) {
	info, err := jsa.streamInfo(ctx, stream)
	if err != nil {
		return nil, err
	}
	hosts := streamHosts(info)
	if len(hosts) == 0 {
		return nil, fmt.Errorf("stream %s has no leader", stream)
	}
	got, err := streamOnEachServer(ctx, sys, account, stream, hosts)
	if err != nil {
		return nil, err
	}
	var missing []string
	for _, h := range hosts {
		if d, found := got[h]; !found || !ok(d) {
			missing = append(missing, h)
		}
	}
	if len(missing) > 0 {
		return missing, nil
	}
	for _, cond := range also {
		if !cond(info, got) {
			return hosts, nil
		}
	}
	return nil, nil
}

// laggingReplicas names the replicas of stream that are not fit for the
// pause (fitForPause), by the leader's account.
func laggingReplicas(ctx context.Context, jsa jsAPI, stream string) ([]string, error) {
	info, err := jsa.streamInfo(ctx, stream)
	if err != nil {
		return nil, err
	}
	if info.Cluster == nil || info.Cluster.Leader == "" {
		return nil, fmt.Errorf("stream %s has no leader", stream)
	}
	var out []string
	for _, r := range info.Cluster.Replicas {
		if !fitForPause(r) {
			out = append(out, r.Name)
		}
	}
	return out, nil
}

// A replica the leader heard from lately and that is at most
// pauseMaxLag entries behind catches up within the pause's settle step.
// The leader counts a replica current only when it persisted every
// committed entry, so under traffic the follower outside the latest
// quorum of an R3 stream is "not current" much of the time (a cold make
// test saw the switch wait on such a replica); one offline, silent or
// far behind would hold the pause.
const (
	pauseMaxLag     = 10_000
	pauseMaxSilence = 5 * time.Second
)

func fitForPause(r *api.PeerInfo) bool {
	return !r.Offline && (r.Current || r.Lag <= pauseMaxLag && r.Active <= pauseMaxSilence)
}

// replicasError says which replicas are not fit for the pause; nil for
// none.
func replicasError(names []string) error {
	if len(names) == 0 {
		return nil
	}
	return fmt.Errorf("replicas %s are offline, silent or far behind", strings.Join(names, ", "))
}

// streamHosts names the servers that host a stream: its leader and
// replicas.
func streamHosts(info *api.StreamInfo) []string {
	if info.Cluster == nil || info.Cluster.Leader == "" {
		return nil
	}
	hosts := []string{info.Cluster.Leader}
	for _, r := range info.Cluster.Replicas {
		hosts = append(hosts, r.Name)
	}
	slices.Sort(hosts)
	return hosts
}

// jszStream is the part of a server's JSZ stream detail the switch reads:
// that server's own configuration and state of the stream.
type jszStream struct {
	Name   string            `json:"name"`
	Config *api.StreamConfig `json:"config"`
	State  struct {
		LastSeq uint64 `json:"last_seq"`
	} `json:"state"`
}

type jszStreams struct {
	Accounts []struct {
		Name    string      `json:"name"`
		Streams []jszStream `json:"stream_detail"`
	} `json:"account_details"`
}

// streamOnEachServer asks every server for its JSZ of account's streams
// and returns stream's detail by server name, once every one of hosts
// answered or a second passed.
func streamOnEachServer(ctx context.Context, sys *nats.Conn, account, stream string, hosts []string) (map[string]jszStream, error) {
	body, err := json.Marshal(struct {
		jszRequest
		Config bool `json:"config"`
	}{jszRequest{Account: account, Streams: true}, true})
	if err != nil {
		return nil, err
	}
	out := map[string]jszStream{}
	err = gather(ctx, sys, fmt.Sprintf(subjPing, "JSZ"), body, time.Second, func(m *nats.Msg) bool {
		var r zReply[jszStreams]
		if json.Unmarshal(m.Data, &r) != nil || r.Data == nil {
			return false
		}
		for _, a := range r.Data.Accounts {
			for _, s := range a.Streams {
				if s.Name == stream {
					out[r.Server.Name] = s
				}
			}
		}
		for _, h := range hosts {
			if _, ok := out[h]; !ok {
				return false
			}
		}
		return true
	})
	return out, err
}

// accountName asks the server which account nc's user is in (the name
// JSZ filters by: the account's public key in operator mode).
func accountName(ctx context.Context, nc *nats.Conn) (string, error) {
	m, err := nc.RequestWithContext(ctx, "$SYS.REQ.USER.INFO", nil)
	if err != nil {
		return "", fmt.Errorf("ask the server for the connection's account: %w", err)
	}
	var r struct {
		Data struct {
			Account string `json:"account"`
		} `json:"data"`
		Error *struct {
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return "", fmt.Errorf("decode the connection's account: %w", err)
	}
	if r.Error != nil || r.Data.Account == "" {
		return "", fmt.Errorf("the server did not name the connection's account: %s", string(m.Data))
	}
	return r.Data.Account, nil
}
