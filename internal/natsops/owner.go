package natsops

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Metadata keys that mark a stream or unit consumer as a topology's
// (NATS 2.10+ stream and consumer metadata). They are written at creation
// and on every Provision, and read before anything is adopted, changed or
// deleted.
const (
	// OwnerKey holds the owning topology's "namespace/name", which is also
	// its registry key.
	OwnerKey = "shardkeeper.dev/owner"
	// OwnerUIDKey holds the owning ShardTopology object's UID.
	OwnerUIDKey = "shardkeeper.dev/owner-uid"
)

// Owner identifies the topology a layout's streams and consumers belong
// to. The zero Owner marks nothing and checks nothing: tools and tests
// that provision outside any topology use it.
type Owner struct {
	// Name is the topology's "namespace/name". Two live objects never
	// share it in one cluster, and one registry keys its rows by it.
	Name string
	// UID is the ShardTopology object's UID: it tells apart two objects
	// that had the same name one after the other.
	UID string
}

func (o Owner) String() string {
	if o.UID == "" {
		return o.Name
	}
	return o.Name + " (uid " + o.UID + ")"
}

// marked says whether o marks and checks anything.
func (o Owner) marked() bool { return o.Name != "" }

// ownerOf reads the owner mark from an object's metadata; ok is false
// when the object carries none (created by hand, or by an operator
// before ownership marks existed).
func ownerOf(meta map[string]string) (Owner, bool) {
	name := meta[OwnerKey]
	if name == "" {
		return Owner{}, false
	}
	return Owner{Name: name, UID: meta[OwnerUIDKey]}, true
}

// ownership is how an object's mark relates to the layout's owner.
type ownership int

const (
	// ownedHere: marked with this topology's name and UID.
	ownedHere ownership = iota
	// adoptable: unmarked, or marked by an earlier object of the same
	// namespace/name (deleted; its finalizer kept consumers holding rows
	// for a successor of that name). Provision marks it as ours.
	adoptable
	// ownedElsewhere: marked by another topology. Never adopted, changed
	// or deleted.
	ownedElsewhere
)

// judgeOwner decides what the layout's owner may do with an object whose
// metadata is meta. A zero owner may do anything (it checks nothing).
func judgeOwner(want Owner, meta map[string]string) (ownership, Owner) {
	got, ok := ownerOf(meta)
	switch {
	case !want.marked():
		return ownedHere, got
	case !ok:
		return adoptable, got
	case got.Name != want.Name:
		return ownedElsewhere, got
	case got.UID != want.UID:
		return adoptable, got
	default:
		return ownedHere, got
	}
}

// withOwner returns meta with the owner's mark set, leaving every other
// key (resume points, the server's own _nats.* keys) as it was. A zero
// owner leaves meta as it is.
func withOwner(meta map[string]string, o Owner) map[string]string {
	if !o.marked() {
		return meta
	}
	out := maps.Clone(meta)
	if out == nil {
		out = map[string]string{}
	}
	out[OwnerKey] = o.Name
	if o.UID != "" {
		out[OwnerUIDKey] = o.UID
	} else {
		delete(out, OwnerUIDKey)
	}
	return out
}

// ownerDrift says whether meta lacks the owner's mark (nil owner: never).
func ownerDrift(meta map[string]string, o Owner) bool {
	if !o.marked() {
		return false
	}
	return meta[OwnerKey] != o.Name || meta[OwnerUIDKey] != o.UID
}

// ErrOwnedElsewhere is what errors.Is finds in an *OwnedElsewhereError.
var ErrOwnedElsewhere = errors.New("NATS objects owned by another topology")

// ForeignObject is a stream or consumer another topology owns.
type ForeignObject struct {
	// Object is "stream <name>" or "consumer <stream>/<name>".
	Object string
	// Owner is the topology its metadata names.
	Owner Owner
}

// OwnedElsewhereError says a layout names streams or consumers that
// another topology owns. Provision refuses to adopt or change them, and
// RetireConsumers to delete them.
type OwnedElsewhereError struct {
	// Owner is the topology that asked.
	Owner Owner
	// Objects are the objects it was refused, sorted.
	Objects []ForeignObject
}

func (e *OwnedElsewhereError) Error() string {
	parts := make([]string, 0, min(len(e.Objects), 4))
	for i, o := range e.Objects {
		if i == 4 {
			parts = append(parts, fmt.Sprintf("and %d more", len(e.Objects)-4))
			break
		}
		parts = append(parts, fmt.Sprintf("%s is owned by topology %s", o.Object, o.Owner))
	}
	return fmt.Sprintf("%s; topology %s leaves them alone (metadata %s)", strings.Join(parts, ", "), e.Owner.Name, OwnerKey)
}

// Is makes errors.Is(err, ErrOwnedElsewhere) true.
func (e *OwnedElsewhereError) Is(target error) bool { return target == ErrOwnedElsewhere }

// Owners lists the distinct topologies named, in order of first mention.
func (e *OwnedElsewhereError) Owners() []string {
	var out []string
	for _, o := range e.Objects {
		if !slices.Contains(out, o.Owner.Name) {
			out = append(out, o.Owner.Name)
		}
	}
	return out
}
