// Package v1alpha1 holds the ShardTopology API of group
// topology.shardkeeper.dev: the spec a platform team declares, the status the
// operator reports, the condition types and reasons, and the CEL rules that
// need nothing but the object itself. Rules that need the world (secrets,
// servers, the registry) belong to the reconciler, not here.
//
// +kubebuilder:object:generate=true
// +groupName=topology.shardkeeper.dev
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of every type in this package.
	GroupVersion = schema.GroupVersion{Group: "topology.shardkeeper.dev", Version: "v1alpha1"}

	// SchemeBuilder registers this package's types with a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds this package's types to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
