package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/dlfs/dlfs/cluster"
	"github.com/dlfs/dlfs/daemon"
)

// doctor's checks of a cluster that dlfs mount does not make: whether
// --join answers, and, for a live mount, whether each member's data
// address answers.

// dialTimeout bounds each of doctor's dials.
const dialTimeout = 2 * time.Second

// checkJoin resolves each --join entry and dials its addresses.
func checkJoin(env doctorEnv, join []string) []daemon.Check {
	var out []daemon.Check
	for _, entry := range join {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		addrs, err := cluster.ResolveJoin(ctx, entry)
		cancel()
		switch {
		case errors.Is(err, cluster.ErrConfig):
			out = append(out, daemon.Check{Level: daemon.Fail, What: "--join", Detail: fmt.Sprintf("%q: want HOST:PORT", entry)})
			continue
		case err != nil:
			out = append(out, daemon.Check{Level: daemon.Warn, What: "--join", Detail: fmt.Sprintf("%s does not resolve (%v): the node will serve alone and keep trying; check the name (a Kubernetes headless Service resolves once its pods exist)", entry, unwrapNet(err))})
			continue
		}
		answered := 0
		var last error
		for _, a := range addrs {
			if err := env.dialTCP(a); err != nil {
				last = err
			} else {
				answered++
			}
		}
		if answered > 0 {
			out = append(out, daemon.Check{Level: daemon.OK, What: "--join", Detail: fmt.Sprintf("%s: %d of %d addresses answer", entry, answered, len(addrs))})
		} else {
			out = append(out, daemon.Check{Level: daemon.Warn, What: "--join", Detail: fmt.Sprintf("%s: none of its %d addresses answers (%v): the node will serve alone until one does; start a member there first, or check the firewall", entry, len(addrs), unwrapNet(last))})
		}
	}
	return out
}

// checkLiveMembers reads the stats of the dlfs mount at mnt and reports
// each alive member whose data address does not answer this node.
func checkLiveMembers(env doctorEnv, mnt, control string) []daemon.Check {
	b, err := os.ReadFile(filepath.Join(mnt, control, "stats"))
	if err != nil {
		return nil
	}
	var st daemon.Stats
	if err := json.Unmarshal(b, &st); err != nil {
		return []daemon.Check{{Level: daemon.Warn, What: "members", Detail: fmt.Sprintf("%s's stats do not parse (%v): is it a dlfs of another version?", mnt, err)}}
	}
	var out []daemon.Check
	peers, bad := 0, 0
	for _, m := range st.Cluster.Members {
		if m.Name == st.Node || m.State != cluster.StateAlive || m.Meta.DataAddr == "" {
			continue
		}
		peers++
		why := ""
		switch {
		case m.Data != nil && !m.Data.Reachable:
			why = m.Data.Error
		case m.Data == nil:
			if err := env.dialTCP(m.Meta.DataAddr); err != nil {
				why = unwrapNet(err).Error()
			}
		}
		if why != "" {
			bad++
			out = append(out, daemon.Check{Level: daemon.Fail, What: "member " + m.Name, Detail: fmt.Sprintf("its data address %s does not answer this node (%s): the samples it owns are read from the PFS instead; check the firewall between the hosts and its --data-addr", m.Meta.DataAddr, why)})
		}
	}
	if peers > 0 && bad == 0 {
		out = append(out, daemon.Check{Level: daemon.OK, What: "members", Detail: strconv.Itoa(peers) + " other members, each data address answers"})
	}
	return out
}
