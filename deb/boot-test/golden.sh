# shellcheck shell=bash
# The golden images of deb/boot-test.sh's cloud-init guests, sourced by it.

# ---- Golden images: prepare-image as docs/install.md's golden-image section says (called
# from ci_guest, once a guest's three boots are done).
#
# The guests of CI_GOLDEN (their user-data carries the token) are builders: each has had its
# first boot from its user-data, and boot 3 as a new instance with a new token. Its NoCloud
# seed is taken away (a builder's seed is a cidata volume or a URL, not part of the image; one
# left in /var/lib/cloud/seed is named by prepare-image), then, as the Packer recipe does,
# `truncate -s 0 /etc/machine-id` and `prepare-image --purge-client-state --cloud-init
# --journal` run in the guest, which then powers off. Its whole tree is searched for every
# token the guest was given: the bytes, `base64 -w0` of them, and each line of them
# base64-wrapped at 76 (as a user-data may carry it). Then one copy of CI_GOLDEN_CLONE's image
# boots as a clone would: a new instance-id and a new token in its seed. It must be licensed
# by the new token, report no last shutdown (the builder's is not its own), and no
# clone_detected (the image was prepared). The copy of a disk that was not prepared is boot 3
# of every cloud-init guest (ci_clone_detected).
CI_GOLDEN=(user-data-write-files.yaml user-data-runcmd.yaml)
CI_GOLDEN_CLONE=user-data-write-files.yaml
CI_PREPARE='truncate -s 0 /etc/machine-id && rm -f /var/lib/dbus/machine-id && vgpu-license-agent prepare-image --purge-client-state --cloud-init --journal'
# Every machine-id the builder booted with (a clone must have none of them).
CI_BUILDER_MACHINE_IDS=

# ci_prepare_image: the builder's last step, in the running guest; prepare-image exits 0 and
# leaves the agent and nvidia-gridd stopped.
ci_prepare_image() {
	local out rc u
	# Its own now, those its journal holds boots of, and D-Bus's copy (which systemd takes for
	# an empty /etc/machine-id).
	CI_BUILDER_MACHINE_IDS=$({
		cat "$GUEST/etc/machine-id" "$GUEST/var/lib/dbus/machine-id" 2>/dev/null
		find "$GUEST/var/log/journal" -mindepth 1 -maxdepth 1 -type d -printf '%f\n' 2>/dev/null
	} | grep -xE '[0-9a-f]{32}' | sort -u | paste -sd' ')
	guest rm -rf "$CI_SEED" || return 1
	echo "the seed $CI_SEED taken away (a builder's cidata volume, not part of the image)"
	echo "in the guest: $CI_PREPARE"
	out=$(guest sh -euc "$CI_PREPARE" 2>&1)
	rc=$?
	echo "$out"
	echo "exit $rc"
	[ "$rc" = 0 ] || return 1
	for u in "$NAME.service" nvidia-gridd.service; do
		if [ "$(guest systemctl is-active "$u")" = active ]; then
			echo "$u is still active after prepare-image" >&2
			rc=1
		fi
	done
	return $rc
}

# ci_prepared_as_documented: what install.md says prepare-image removes is gone, what it
# keeps is there. Lists what is left of the token's, the agent's, gridd's and cloud-init's.
ci_prepared_as_documented() {
	local rc=0 p left
	echo "left in the image:"
	(cd "$GUEST" && find etc/nvidia etc/$NAME var/lib/cloud var/lib/$NAME var/lib/$NAME.image-prepared.json \
		var/lib/nvidia var/log/journal -maxdepth 2 2>/dev/null | sort | sed 's/^/  \//')
	(cd "$GUEST" && find var/log -maxdepth 1 -name 'cloud-init*' | sed 's/^/  left: \//')
	if [ -n "$(ls -A "$GUEST${TOKEN_GUEST%/*}" 2>/dev/null)" ]; then
		echo "the token directory ${TOKEN_GUEST%/*} is not empty" >&2
		rc=1
	fi
	left=$(find "$GUEST/var/lib/cloud" -mindepth 1 -maxdepth 1 ! -name seed -printf '%f ' 2>/dev/null)
	[ -z "$left" ] || {
		echo "/var/lib/cloud still holds (but its seed): $left" >&2
		rc=1
	}
	[ -z "$(find "$GUEST/var/log" -maxdepth 1 -name 'cloud-init*.log')" ] || {
		echo "cloud-init's logs are still in /var/log" >&2
		rc=1
	}
	for p in etc/nvidia/gridd.conf etc/$NAME/config.d/50-cloud-init.toml var/lib/$NAME.image-prepared.json; do
		case "$p:$CI_GOLDEN_FILE" in
		*50-cloud-init.toml:user-data-runcmd.yaml) continue ;; # runcmd writes no drop-in
		esac
		[ -f "$GUEST/$p" ] || {
			echo "/$p is gone (prepare-image keeps it, or records it)" >&2
			rc=1
		}
	done
	[ ! -s "$GUEST/etc/machine-id" ] || {
		echo "/etc/machine-id is not empty" >&2
		rc=1
	}
	return $rc
}

# ci_token_patterns FILE TOKEN...: the strings a search for the tokens looks for, one a line:
# each token's bytes, its base64 -w0, and each whole line of its base64 wrapped at 76.
ci_token_patterns() {
	local out=$1 t
	shift
	(umask 077 && : >"$out") || return 1
	for t in "$@"; do
		{
			cat "$t"
			echo
			base64 -w0 "$t"
			echo
			base64 -w76 "$t" | awk 'length($0) == 76'
		} | awk 'length($0) >= 40' >>"$out"
	done
}

# ci_tree_holds_no_token: no file of the powered-off image's tree holds a token this guest was
# given (the search is first shown to find each form in a file that holds it).
ci_tree_holds_no_token() {
	local pats=$WORK/golden-patterns control=$WORK/golden-control tokens=() n form found rc=0
	for n in $(seq "$CI_TOKENS"); do tokens+=("$WORK/token-$n"); done
	ci_token_patterns "$pats" "${tokens[@]}" || return 1
	echo "searching for ${#tokens[@]} token(s) ($(wc -c <"${tokens[0]}") bytes each): $(grep -c . "$pats") strings (raw, base64 -w0, base64 wrapped at 76)"
	for form in raw w0 w76; do
		case $form in
		raw) cp "${tokens[0]}" "$control" ;;
		w0) { echo "content: $(base64 -w0 "${tokens[0]}")"; } >"$control" ;;
		w76) base64 -w76 "${tokens[0]}" >"$control" ;;
		esac
		LC_ALL=C grep -qF -f "$pats" "$control" || {
			echo "the search does not find a token written $form" >&2
			rc=1
		}
	done
	rm -f "$control"
	echo "the whole tree: $(find "$GUEST" -xdev -type f | wc -l) files, $(du -sxh "$GUEST" | cut -f1)"
	found=$(LC_ALL=C grep -rlF -D skip -f "$pats" "$GUEST")
	rm -f "$pats"
	if [ -n "$found" ]; then
		echo "files of the prepared image that hold a token:" >&2
		printf '%s\n' "${found//"$GUEST"/}" >&2
		rc=1
	else
		echo "no file holds a token"
	fi
	return $rc
}

# ci_no_last_shutdown: the clone's report has no last shutdown (the journal's previous boot is
# the builder's).
ci_no_last_shutdown() {
	guest vgpu-license-agent status --json | "$PYTHON" -c '
import json, sys
r = json.load(sys.stdin)
print("last_shutdown:", r.get("last_shutdown"))
sys.exit(0 if r.get("last_shutdown") is None else 1)' || return 1
	echo "vgpu_license_last_return_success: $(agent_metric vgpu_license_last_return_success)"
}

# ci_own_machine_id: the clone's machine-id is none that the builder had.
ci_own_machine_id() {
	local mid
	mid=$(guest cat /etc/machine-id)
	echo "machine-id: the builder's $CI_BUILDER_MACHINE_IDS; the clone's $mid"
	[ -n "$mid" ] || return 1
	case " $CI_BUILDER_MACHINE_IDS " in
	*" $mid "*)
		[ "$mid" != "$(cat "$GUEST/var/lib/dbus/machine-id" 2>/dev/null)" ] ||
			echo "the clone took /var/lib/dbus/machine-id, which truncate -s 0 /etc/machine-id leaves in the image: every clone gets that id" >&2
		return 1
		;;
	esac
}

# ci_no_clone_detected: the clone's report has no clone_detected event.
ci_no_clone_detected() {
	guest vgpu-license-agent status --json | "$PYTHON" -c '
import json, sys
r = json.load(sys.stdin)
kinds = [e.get("kind") for e in r.get("events", [])]
print("events:", kinds)
sys.exit(0 if "clone_detected" not in kinds else 1)'
}

# ci_golden_clone FILE: boots a copy of the prepared image with a new instance-id and a new token.
ci_golden_clone() {
	local file=$1 builder=$GUEST id start=$SECONDS kind=${1#user-data-}
	kind=${kind%.yaml}
	id=iid-$kind-clone
	GUEST=$builder-clone
	banner "[$SUITE] golden image: a copy of it (cp -a --reflink=auto), seeded with $id and a new token"
	if ! cp -a --reflink=auto "$builder" "$GUEST" || ! ci_new_token || ! ci_seed "$file" "$id"; then
		fail "[$SUITE] golden image: cannot make the clone"
	elif boot_guest; then
		check "golden clone: cloud-init finished, as the new instance ($id)" ci_cloud_init_done "$id"
		check "golden clone: the new token is installed" ci_token_installed
		check "golden clone: licensed by the new token's DLS ($CI_DLS_HOST)" ci_report
		check "golden clone: no last shutdown reported (the journal's previous boot is the builder's)" ci_no_last_shutdown
		check "golden clone: no clone_detected event (the image was prepared)" ci_no_clone_detected
		check "golden clone: a machine-id that is none of the builder's" ci_own_machine_id
		check "golden clone: the agent is active" check_agent_active
	fi
	stop_guest
	GUEST=$builder
	TIMES+=("golden clone ${kind}: $((SECONDS - start)) s")
}

# ci_golden FILE: the current guest, booted, becomes a golden image (see above).
CI_GOLDEN_FILE=
ci_golden() {
	local file=$1 start=$SECONDS g kind=${1#user-data-}
	kind=${kind%.yaml}
	CI_GOLDEN_FILE=$file
	for g in "${CI_GOLDEN[@]}"; do [ "$g" = "$file" ] && break; done
	[ "$g" = "$file" ] || return 0
	if [ -z "$LEADER" ]; then
		fail "[$SUITE] golden image: not made, boot 3 did not come up"
		return
	fi
	check "golden image: the seed taken away, prepare-image as install.md's Packer recipe runs it, exit 0, services stopped" ci_prepare_image
	if ! halt_guest; then
		fail "[$SUITE] golden image: the builder did not power off"
		return
	fi
	check "golden image: what prepare-image removes is gone, what it keeps is there" ci_prepared_as_documented
	check "golden image: no file of the whole tree holds a token the builder had (raw, base64, wrapped at 76)" ci_tree_holds_no_token
	TIMES+=("golden image ${kind}: $((SECONDS - start)) s")
	[ "$file" != "$CI_GOLDEN_CLONE" ] || ci_golden_clone "$file"
}
