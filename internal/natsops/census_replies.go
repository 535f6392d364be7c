package natsops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// System account subjects the census asks. Every server subscribes to the
// PING form; the direct form reaches one server by ID.
const (
	subjPing   = "$SYS.REQ.SERVER.PING.%s"
	subjDirect = "$SYS.REQ.SERVER.%s.%s"
)

// serverIdent is the "server" block every system reply starts with.
type serverIdent struct {
	Name      string `json:"name"`
	Host      string `json:"host"`
	ID        string `json:"id"`
	Cluster   string `json:"cluster"`
	Domain    string `json:"domain"`
	Version   string `json:"ver"`
	JetStream bool   `json:"jetstream"`
}

type peerInfo struct {
	Name    string `json:"name"`
	Peer    string `json:"peer"`
	Current bool   `json:"current"`
	Offline bool   `json:"offline"`
}

// metaInfo is a server's view of its JetStream meta group. Only the
// leader lists the replicas.
type metaInfo struct {
	Name     string     `json:"name"`
	Leader   string     `json:"leader"`
	Replicas []peerInfo `json:"replicas"`
	Size     int        `json:"cluster_size"`
}

// statszReply is the part of a STATSZ reply the census reads.
type statszReply struct {
	Server serverIdent `json:"server"`
	Stats  struct {
		ActiveServers int `json:"active_servers"`
		Routes        []struct {
			Name string `json:"name"`
		} `json:"routes"`
		JetStream *struct {
			Stats *struct {
				API struct {
					Level int `json:"level"`
				} `json:"api"`
			} `json:"stats"`
			Meta *metaInfo `json:"meta"`
		} `json:"jetstream"`
	} `json:"statsz"`
}

// zReply is the envelope of the monitoring replies (JSZ, LEAFZ).
type zReply[T any] struct {
	Server serverIdent `json:"server"`
	Data   *T          `json:"data"`
	Error  *struct {
		Code        int    `json:"code"`
		Description string `json:"description"`
	} `json:"error"`
}

type jszData struct {
	Meta     *metaInfo `json:"meta_cluster"`
	Accounts []struct {
		Name    string `json:"name"`
		ID      string `json:"id"`
		Streams []struct {
			Name      string         `json:"name"`
			Consumers []consumerInfo `json:"consumer_detail"`
		} `json:"stream_detail"`
	} `json:"account_details"`
}

type consumerInfo struct {
	Stream        string `json:"stream_name"`
	Name          string `json:"name"`
	NumPending    uint64 `json:"num_pending"`
	NumAckPending int    `json:"num_ack_pending"`
	Cluster       *struct {
		Name     string     `json:"name"`
		Leader   string     `json:"leader"`
		Replicas []peerInfo `json:"replicas"`
		Desired  *struct {
			Replicas []peerInfo `json:"replicas"`
		} `json:"desired"`
	} `json:"cluster"`
}

type leafzData struct {
	Leafs []struct {
		Name    string `json:"name"`
		IsSpoke bool   `json:"is_spoke"`
		Account string `json:"account"`
	} `json:"leafs"`
}

// jszRequest is the subset of the server's JSzOptions the census sends.
type jszRequest struct {
	Account    string `json:"account,omitempty"`
	Accounts   bool   `json:"accounts,omitempty"`
	Streams    bool   `json:"streams,omitempty"`
	Consumer   bool   `json:"consumer,omitempty"`
	LeaderOnly bool   `json:"leader_only,omitempty"`
}

// gather publishes one request to subject and hands every reply to onMsg
// until onMsg says it has enough, the timeout passes or ctx ends. Running
// out of time is not an error: the census judges what it heard.
func gather(ctx context.Context, nc *nats.Conn, subject string, body []byte, timeout time.Duration, onMsg func(*nats.Msg) (enough bool)) error {
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return fmt.Errorf("subscribe for %s replies: %w", subject, err)
	}
	defer sub.Unsubscribe()
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		return fmt.Errorf("subscribe for %s replies: %w", subject, err)
	}
	if err := nc.PublishRequest(subject, inbox, body); err != nil {
		return fmt.Errorf("request %s: %w", subject, err)
	}
	tctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		m, err := sub.NextMsgWithContext(tctx)
		switch {
		case err == nil:
			if onMsg(m) {
				return nil
			}
		case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
			return nil
		case errors.Is(err, nats.ErrNoResponders):
			// Nobody subscribes to the subject in this account.
			return nil
		default:
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("read %s replies: %w", subject, err)
		}
	}
}

// gatherZ pings every server for a monitoring endpoint and returns the
// replies by server name, stopping once want servers answered.
func gatherZ[T any](ctx context.Context, nc *nats.Conn, cost *censusCost, endpoint string, req any, want int, timeout time.Duration) (map[string]zReply[T], error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	got := map[string]zReply[T]{}
	err = gather(ctx, nc, fmt.Sprintf(subjPing, endpoint), body, timeout, func(m *nats.Msg) bool {
		var r zReply[T]
		if json.Unmarshal(m.Data, &r) == nil && r.Server.Name != "" {
			got[r.Server.Name] = r
		}
		cost.add(len(m.Data), 0)
		return len(got) >= want
	})
	return got, err
}

// requestZ asks one server, by ID, for a monitoring endpoint.
func requestZ[T any](ctx context.Context, nc *nats.Conn, cost *censusCost, serverID, endpoint string, req any, timeout time.Duration) (*zReply[T], error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	tctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	m, err := nc.RequestWithContext(tctx, fmt.Sprintf(subjDirect, serverID, endpoint), body)
	if err != nil {
		return nil, fmt.Errorf("request %s of server %s: %w", endpoint, serverID, err)
	}
	cost.add(len(m.Data), 0)
	var r zReply[T]
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return nil, fmt.Errorf("decode %s of server %s: %w", endpoint, serverID, err)
	}
	if r.Error != nil {
		return &r, fmt.Errorf("%s of server %s: %s", endpoint, serverID, r.Error.Description)
	}
	return &r, nil
}

// censusCost counts what a census read, for CensusRead.
type censusCost struct {
	mu        sync.Mutex
	replies   int
	bytes     int64
	consumers int
}

// add counts one reply of n bytes that held consumers consumer entries.
func (c *censusCost) add(n, consumers int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.replies++
	c.bytes += int64(n)
	c.consumers += consumers
}

// addConsumers counts consumer entries of replies already counted.
func (c *censusCost) addConsumers(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.consumers += n
}
