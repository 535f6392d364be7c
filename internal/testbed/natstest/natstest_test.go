package natstest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

func TestClusterOfThreeServesJetStreamAndSystemAccount(t *testing.T) {
	c := StartCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	js, err := jetstream.New(c.Connect(0))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}, Replicas: 3}); err != nil {
		t.Fatalf("create R3 stream: %v", err)
	}

	// The system user sees every server answer a ping.
	sys := c.ConnectSys(1)
	inbox := sys.NewRespInbox()
	sub, err := sys.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := sys.PublishRequest("$SYS.REQ.SERVER.PING", inbox, nil); err != nil {
		t.Fatal(err)
	}
	seen := 0
	for seen < 3 {
		if _, err := sub.NextMsg(5 * time.Second); err != nil {
			t.Fatalf("saw %d of 3 servers answer the system ping: %v", seen, err)
		}
		seen++
	}
}

func TestSingleServerHasNoClusterBlock(t *testing.T) {
	c := StartCluster(t, 1)
	if c.Configs[0].ClusterPort != 0 {
		t.Fatalf("lone server got a cluster port")
	}
	if _, err := jetstream.New(c.Connect(0)); err != nil {
		t.Fatal(err)
	}
}
