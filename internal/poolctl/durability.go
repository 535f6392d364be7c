package poolctl

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Durability is what the registry's PostgreSQL promises about a commit
// it acknowledged surviving a failover, as its settings say (issue 22).
type Durability struct {
	// Durable is true when commits wait for a synchronous standby:
	// synchronous_standby_names names one and synchronous_commit is on,
	// remote_write or remote_apply.
	Durable bool
	// Reason is the CamelCase reason for the RegistryDurable condition.
	Reason string
	// Message says what the settings are and what follows from them.
	Message string

	SynchronousStandbyNames string
	SynchronousCommit       string
	// Standbys is how many standbys stream from the server (0 when the
	// role may not see pg_stat_replication's rows, which is not an error).
	Standbys int
}

// Reasons of the RegistryDurable condition.
const (
	DurableSynchronous  = "SynchronousReplication"
	DurableAsynchronous = "AsynchronousReplication"
	DurableLocalCommit  = "SynchronousCommitLocal"
	DurableNoStandby    = "NoStandby"
)

// ReadDurability reads the server's replication settings. With a managed
// service the settings can be read but not changed by this role: the
// condition says what to ask the platform team for.
func (p *PG) ReadDurability(ctx context.Context) (Durability, error) {
	return scanDurability(p.pool.QueryRow(ctx, durabilitySQL))
}

// durabilitySQL reads the settings ReadDurability judges.
const durabilitySQL = `SELECT current_setting('synchronous_standby_names'), current_setting('synchronous_commit'),
	(SELECT count(*) FROM pg_stat_replication)::int`

// scanDurability scans durabilitySQL's row and judges it.
func scanDurability(row pgx.Row) (Durability, error) {
	var d Durability
	if err := row.Scan(&d.SynchronousStandbyNames, &d.SynchronousCommit, &d.Standbys); err != nil {
		return Durability{}, fmt.Errorf("read the registry's replication settings: %w", err)
	}
	return judgeDurability(d), nil
}

// judgeDurability sets Durable, Reason and Message from the settings.
func judgeDurability(d Durability) Durability {
	names := strings.TrimSpace(d.SynchronousStandbyNames)
	switch {
	case names == "" && d.Standbys == 0:
		d.Reason = DurableNoStandby
		d.Message = "no standby streams from the registry and none is synchronous: a failover (to a replica restored from backup) loses every commit since the backup; ownership stays safe (the registry sequence detects it and Recover moves tokens past it), rows a sink in the same database acknowledged are lost"
	case names == "":
		d.Reason = DurableAsynchronous
		d.Message = fmt.Sprintf("%d standby(s) replicate asynchronously (synchronous_standby_names is empty): a failover loses the commits of the replication lag; ownership stays safe (detected by the registry sequence, recovered by moving tokens and epochs past it), rows a sink in the same database acknowledged during the lag are lost. Set CloudNativePG's dataDurability: required or Patroni's synchronous_mode_strict", d.Standbys)
	case d.SynchronousCommit == "on" || d.SynchronousCommit == "remote_write" || d.SynchronousCommit == "remote_apply":
		d.Durable = true
		d.Reason = DurableSynchronous
		d.Message = fmt.Sprintf("commits wait for synchronous standby %q (synchronous_commit=%s); a commit whose wait was cancelled (a statement timeout) is visible before it is replicated and is treated as unknown", names, d.SynchronousCommit)
	default:
		d.Reason = DurableLocalCommit
		d.Message = fmt.Sprintf("synchronous_standby_names is %q but synchronous_commit=%s does not wait for it: a failover can lose acknowledged commits", names, d.SynchronousCommit)
	}
	return d
}
