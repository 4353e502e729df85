# proc-cpu.sh, sourced by the bench scripts: CPU counters from /proc, in ticks (1/100 s of user + system time).
# ticks PID: the process's own. pgticks: every process of the database server's OS user (PGOS_USER, postgres),
# with their reaped children's (a backend that exited is counted in the postmaster's).
ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
pgticks() { local s=0 t p; for p in $(pgrep -u "${PGOS_USER:-postgres}"); do
  t=$(awk '{print $14+$15+$16+$17}' "/proc/$p/stat" 2>/dev/null) && s=$((s + ${t:-0})); done; echo $s; }
