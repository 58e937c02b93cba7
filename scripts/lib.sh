# Shared by the service scripts; sourced, not run. The caller sets NAME, the
# prefix of its messages.

log() { echo "$NAME: $*" >&2; }
die() {
	log "ERROR: $*"
	exit 1
}

# apt_install PACKAGE WHY: installs a Debian package system-wide, saying so
# first; with DEDUP_NO_APT=1 it stops instead, naming the package.
apt_install() {
	if [[ "${DEDUP_NO_APT:-}" == 1 ]]; then
		die "$2: install it (apt-get install $1) or unset DEDUP_NO_APT to let this script do it"
	fi
	log "$2: installing it system-wide with apt-get install $1 (set DEDUP_NO_APT=1 to stop instead)"
	apt-get update -qq >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$1" >/dev/null
}

# wait_for SECONDS COMMAND...: retries COMMAND every 0.5 s, for up to SECONDS.
wait_for() {
	local seconds="$1" i
	shift
	for ((i = 0; i < seconds * 2; i++)); do
		if "$@" >/dev/null 2>&1; then
			return 0
		fi
		sleep 0.5
	done
	return 1
}
