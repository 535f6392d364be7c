package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
)

const namespace = "default"

// runScenario applies the sample before the Secrets and StatefulSet it
// names exist, shows the operator report that as Stalled, then supplies
// them and shows the status that follows.
func runScenario(ctx context.Context, k client.Client, samplePath string) error {
	b, err := os.ReadFile(samplePath)
	if err != nil {
		return err
	}
	topo := &topologyv1.ShardTopology{}
	if err := yaml.UnmarshalStrict(b, topo); err != nil {
		return fmt.Errorf("decode %s: %w", samplePath, err)
	}
	topo.Namespace = namespace
	say("applying %s", samplePath)
	if err := k.Create(ctx, topo); err != nil {
		return fmt.Errorf("apply sample: %w", err)
	}
	key := client.ObjectKeyFromObject(topo)

	say("the sample names Secrets and a StatefulSet that do not exist yet:")
	if _, err := waitFor(ctx, k, key, stalledWith(topologyv1.ReasonSecretNotFound)); err != nil {
		return err
	}

	say("creating Secrets %s, %s and StatefulSet %s", topo.Spec.Registry.DSNSecretRef.Name,
		topo.Spec.NATS.CredentialsSecretRef.Name, topo.Spec.Workload.StatefulSetName)
	if err := createPrerequisites(ctx, k, topo); err != nil {
		return err
	}
	final, err := waitFor(ctx, k, key, func(t *topologyv1.ShardTopology) bool {
		return meta.IsStatusConditionFalse(t.Status.Conditions, topologyv1.ConditionStalled)
	})
	if err != nil {
		return err
	}
	say("final status of shardtopology/%s:", final.Name)
	printConditions(final)
	return nil
}

// waitFor prints the object every time its status changes until done holds.
func waitFor(ctx context.Context, k client.Client, key client.ObjectKey, done func(*topologyv1.ShardTopology) bool) (*topologyv1.ShardTopology, error) {
	last := ""
	for {
		t := &topologyv1.ShardTopology{}
		if err := k.Get(ctx, key, t); err != nil {
			return nil, err
		}
		if line := summary(t); line != last {
			fmt.Println("    " + line)
			last = line
		}
		if done(t) {
			return t, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for shardtopology/%s: %w", key.Name, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func stalledWith(reason string) func(*topologyv1.ShardTopology) bool {
	return func(t *topologyv1.ShardTopology) bool {
		c := meta.FindStatusCondition(t.Status.Conditions, topologyv1.ConditionStalled)
		return c != nil && c.Status == metav1.ConditionTrue && c.Reason == reason
	}
}

// summary is one line in the spirit of `kubectl get shardtopology`.
func summary(t *topologyv1.ShardTopology) string {
	var conds []string
	for _, c := range t.Status.Conditions {
		conds = append(conds, fmt.Sprintf("%s=%s(%s)", c.Type, c.Status, c.Reason))
	}
	return fmt.Sprintf("N=%d V=%d phase=%s observedGeneration=%d %s",
		t.Spec.Partitions, t.Spec.ShardsPerPartition, t.Status.Phase, t.Status.ObservedGeneration, strings.Join(conds, " "))
}

func printConditions(t *topologyv1.ShardTopology) {
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "    TYPE\tSTATUS\tREASON\tMESSAGE")
	for _, c := range t.Status.Conditions {
		fmt.Fprintf(w, "    %s\t%s\t%s\t%s\n", c.Type, c.Status, c.Reason, c.Message)
	}
	w.Flush()
}

func createPrerequisites(ctx context.Context, k client.Client, t *topologyv1.ShardTopology) error {
	secrets := map[string]map[string][]byte{}
	add := func(ref *topologyv1.SecretKeyRef) {
		if ref == nil {
			return
		}
		if secrets[ref.Name] == nil {
			secrets[ref.Name] = map[string][]byte{}
		}
		secrets[ref.Name][ref.Key] = []byte("demo")
	}
	add(&t.Spec.Registry.DSNSecretRef)
	add(t.Spec.NATS.CredentialsSecretRef)
	add(t.Spec.NATS.SystemCredentialsSecretRef)
	for name, data := range secrets {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, Data: data}
		if err := k.Create(ctx, s); err != nil {
			return fmt.Errorf("create Secret %s: %w", name, err)
		}
	}
	labels := map[string]string{"app": t.Spec.Workload.StatefulSetName}
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: t.Spec.Workload.StatefulSetName, Namespace: namespace},
		Spec: appsv1.StatefulSetSpec{
			Selector:       &metav1.LabelSelector{MatchLabels: labels},
			UpdateStrategy: appsv1.StatefulSetUpdateStrategy{Type: appsv1.OnDeleteStatefulSetStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "worker", Image: "shardkeeper-worker"}}},
			},
		},
	}
	if err := k.Create(ctx, sts); err != nil {
		return fmt.Errorf("create StatefulSet %s: %w", sts.Name, err)
	}
	return nil
}
