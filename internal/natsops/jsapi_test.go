package natsops

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/jsm.go/api"

	"github.com/shardkeeper/shardkeeper/internal/testbed/natstest"
)

func TestNextPageFollowsTheServersPagingAndStopsOnAnEmptyPage(t *testing.T) {
	for _, tc := range []struct {
		name        string
		offset, got int
		page        api.JSApiIterableResponse
		next        int
		more        bool
	}{
		{"one page holds everything", 0, 3, api.JSApiIterableResponse{Total: 3, Limit: 256}, 0, false},
		{"a full first page of two", 0, 256, api.JSApiIterableResponse{Total: 300, Limit: 256}, 256, true},
		{"the last page", 256, 44, api.JSApiIterableResponse{Total: 300, Offset: 256, Limit: 256}, 0, false},
		{"a server claiming more but sending none stops", 0, 0, api.JSApiIterableResponse{Total: 300, Limit: 256}, 0, false},
		{"a zero limit stops", 0, 5, api.JSApiIterableResponse{Total: 300}, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next, more := nextPage(tc.offset, tc.got, tc.page)
			if next != tc.next || more != tc.more {
				t.Fatalf("nextPage = %d, %v; want %d, %v", next, more, tc.next, tc.more)
			}
		})
	}
}

// The not-found branches of Provision and RetireConsumers rely on
// api.IsNatsError recognizing what jsAPI.do returns, wrapped or not.
func TestAPIErrorsAreRecognizedByTheirCode(t *testing.T) {
	resp := api.JSApiStreamInfoResponse{JSApiResponse: api.JSApiResponse{Error: &api.ApiError{Code: 404, ErrCode: errCodeStreamNotFound, Description: "stream not found"}}}
	err := resp.ToError()
	if ae, ok := err.(api.ApiError); ok {
		err = &ae // as jsAPI.do returns it
	}
	wrapped := errors.Join(errors.New("load stream X"), err)
	for name, e := range map[string]error{"bare": err, "wrapped": wrapped} {
		if !api.IsNatsError(e, errCodeStreamNotFound) {
			t.Errorf("%s: IsNatsError(%v, stream not found) = false", name, e)
		}
		if api.IsNatsError(e, errCodeConsumerNotFound) {
			t.Errorf("%s: IsNatsError(%v, consumer not found) = true", name, e)
		}
	}
}

// A request nobody answers (a stream whose leader is down, a meta group
// electing) fails after requestTimeout even when the caller's context
// allows a minute: chaos scenario 7 saw one consumer listing hold a whole
// reconcile pass, and with it the census, to the caller's deadline.
func TestAnUnansweredRequestFailsAtItsOwnBoundNotTheCallersDeadline(t *testing.T) {
	c := natstest.StartCluster(t, 1)
	nc := c.Connect(0)
	// A responder that takes every request and never replies: NATS then
	// has a responder, so only the request's own deadline ends the wait.
	sub, err := nc.SubscribeSync("test.silent")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx := testContext(t, time.Minute)
	start := time.Now()
	var resp api.JSApiConsumerListResponse
	err = jsAPI{nc}.do(ctx, "test.silent", &api.JSApiConsumerListRequest{}, &resp)
	took := time.Since(start)
	if err == nil {
		t.Fatal("an unanswered request succeeded")
	}
	if _, err := sub.NextMsg(time.Second); err != nil {
		t.Fatalf("the request never reached the silent responder, so the bound was not what ended it: %v", err)
	}
	// Room for a loaded box above the bound, far below the caller's minute.
	if took > requestTimeout+15*time.Second {
		t.Fatalf("the request took %s to fail; want about requestTimeout (%s), not the caller's deadline", took, requestTimeout)
	}
	t.Logf("the unanswered request failed after %s: %v", took.Round(time.Millisecond), err)
}
