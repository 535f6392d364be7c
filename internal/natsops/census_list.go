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

// The census places the inspected consumers by listing their streams'
// consumers ($JS.API.CONSUMER.LIST.<stream>) through a connection in their
// account, not by asking every server for every consumer it hosts (JSZ):
// the listing reads the topology's own streams, so its cost grows with the
// topology's consumers, while JSZ has no stream filter and replies with
// every consumer of the account (or of every account), whatever topology
// or fleet it belongs to. In a cluster the meta leader answers the listing
// with each consumer's info as its raft leader reports it: the leader, every
// peer of its group (an offline one too, by name or by peer ID) and the
// pending and unacknowledged rows.

// listPageTimeout bounds one page of a listing beyond the census's own
// timeout: the meta leader waits up to 4s for the consumers' leaders
// before it answers with what it has and names the rest missing.
const listPageTimeout = 4 * time.Second

// listConcurrency bounds the streams listed at once, and with it the pages
// a census holds in memory (a page is at most 256 consumers).
const listConcurrency = 4

// consumerListPage is the part of a CONSUMER.LIST reply the census reads:
// no consumer's configuration, only its placement and counts.
type consumerListPage struct {
	Error *struct {
		Code        int    `json:"code"`
		ErrCode     int    `json:"err_code"`
		Description string `json:"description"`
	} `json:"error"`
	Total     int               `json:"total"`
	Offset    int               `json:"offset"`
	Limit     int               `json:"limit"`
	Consumers []consumerInfo    `json:"consumers"`
	Missing   []string          `json:"missing"`
	Offline   map[string]string `json:"offline"`
}

// listConsumers lists every stream of the inspected consumers through
// opts.JetStream, keeping only the inspected consumers' placements. A
// stream that cannot be listed leaves its consumers unfound, with a
// finding: the census fails closed for them. It returns the findings for
// the caller to merge, and an error only when ctx ends.
func (b *censusBuilder) listConsumers(ctx context.Context) ([]string, error) {
	streams := map[string]map[string]bool{}
	var order []string
	for _, ref := range b.opts.Consumers {
		if streams[ref.Stream] == nil {
			streams[ref.Stream] = map[string]bool{}
			order = append(order, ref.Stream)
		}
		streams[ref.Stream][ref.Name] = true
	}
	b.listed = make(map[ConsumerRef]consumerInfo, len(b.opts.Consumers))
	// Listings wait for consumers' leaders (up to 4s a page while one is
	// being elected); they end before the caller's deadline, so the
	// census is still judged, with the unlisted streams' consumers not
	// found, instead of failing as a whole.
	lctx := ctx
	if deadline, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		lctx, cancel = context.WithDeadline(ctx, time.Now().Add(time.Until(deadline)*3/4))
		defer cancel()
	}
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		sem      = make(chan struct{}, listConcurrency)
		findings []string
	)
	for _, stream := range order {
		wg.Go(func() {
			var (
				kept []consumerInfo
				fs   []string
				err  error
			)
			select {
			case sem <- struct{}{}:
				kept, fs, err = b.listStream(lctx, stream, streams[stream])
				<-sem
			case <-lctx.Done():
				err = lctx.Err()
			}
			if err != nil && ctx.Err() == nil {
				fs = append(fs, fmt.Sprintf("stream %s: its consumers could not all be listed (%v); those not listed are not found", stream, err))
			}
			mu.Lock()
			defer mu.Unlock()
			for _, ci := range kept {
				b.listed[ConsumerRef{Stream: stream, Name: ci.Name}] = ci
			}
			findings = append(findings, fs...)
		})
	}
	wg.Wait()
	return findings, ctx.Err()
}

// listStream reads one stream's consumers page by page and keeps those
// named in want; an inspected consumer the server names missing or
// offline is a finding.
func (b *censusBuilder) listStream(ctx context.Context, stream string, want map[string]bool) (kept []consumerInfo, findings []string, err error) {
	subject := fmt.Sprintf("$JS.API.CONSUMER.LIST.%s", stream)
	for offset := 0; ; {
		body, err := json.Marshal(struct {
			Offset int `json:"offset"`
		}{offset})
		if err != nil {
			return kept, findings, err
		}
		pctx, cancel := context.WithTimeout(ctx, b.opts.Timeout+listPageTimeout)
		m, err := b.opts.JetStream.RequestWithContext(pctx, subject, body)
		cancel()
		if errors.Is(err, nats.ErrNoResponders) {
			return kept, findings, fmt.Errorf("no JetStream answers %s in the connection's account", subject)
		}
		if err != nil {
			return kept, findings, fmt.Errorf("request %s: %w", subject, err)
		}
		var page consumerListPage
		if err := json.Unmarshal(m.Data, &page); err != nil {
			return kept, findings, fmt.Errorf("decode %s reply: %w", subject, err)
		}
		b.cost.add(len(m.Data), len(page.Consumers))
		if page.Error != nil {
			return kept, findings, fmt.Errorf("%s: %s (code %d)", subject, page.Error.Description, page.Error.ErrCode)
		}
		listed := map[string]bool{}
		for _, ci := range page.Consumers {
			listed[ci.Name] = true
			if want[ci.Name] {
				kept = append(kept, ci)
			}
		}
		for _, name := range page.Missing {
			if !want[name] || listed[name] {
				continue // listed with its offline peers: placement judges it
			}
			reason := page.Offline[name]
			if reason == "" {
				reason = "its leader did not answer the meta leader"
			}
			findings = append(findings, fmt.Sprintf("consumer %s/%s is missing from its stream's listing: %s", stream, name, reason))
		}
		next := offset + page.Limit
		if page.Limit <= 0 || next >= page.Total {
			return kept, findings, nil
		}
		offset = next
	}
}
