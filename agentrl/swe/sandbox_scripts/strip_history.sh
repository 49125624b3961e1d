#!/bin/sh
# strip_history.sh WORKDIR MODE: run as the sandbox's root at baseline, before the agent starts.
#
# Every git repository of the work tree (its .git, the submodules' git dirs under .git/modules/, any other
# .git inside the tree, the git dir a .git file points to) is rebuilt from a whitelist: a fresh git dir
# holding the objects MODE keeps, HEAD's branch (or a detached HEAD), the config, the index when it is
# HEAD's, info/{exclude,attributes,sparse-checkout}. Whatever else the old one held is gone with it: other
# branches, tags, remote-tracking, notes, stash and replace refs, packed-refs, reflogs, ORIG_HEAD and its
# kin, worktrees, rr-cache, alternates, unreachable objects in loose files or packs, .keep'd packs.
#   MODE ancestry: HEAD and its ancestors (git log and blame work as in the image)
#   MODE head:     HEAD's commit and tree alone, as a shallow clone of depth 1 (HEAD's id is kept)
set -eu
w=$1 mode=$2
case $mode in ancestry|head) ;; *) echo "strip_history: unknown mode $mode" >&2; exit 2 ;; esac
missing=
for tool in git find sort cut tr mv stat chown; do command -v "$tool" > /dev/null 2>&1 || missing="$missing $tool"; done
if [ -n "$missing" ]; then
    # An image this bare has no git for the agent either; a repository at the top still must not pass unstripped.
    if [ -e "$w/.git" ]; then
        echo "strip_history: the image has no$missing, which stripping $w/.git needs: add them to the image" >&2
        exit 3
    fi
    exit 0
fi
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null GIT_TERMINAL_PROMPT=0 LC_ALL=C
unset GIT_DIR GIT_WORK_TREE GIT_INDEX_FILE GIT_OBJECT_DIRECTORY GIT_ALTERNATE_OBJECT_DIRECTORIES
# The image's own config must not run anything here: no hooks, no fsmonitor, no maintenance.
g() { git -c safe.directory='*' -c core.hooksPath=/dev/null -c core.fsmonitor=false -c gc.auto=0 \
          -c maintenance.auto=false -c core.logAllRefUpdates=false -c pack.writeBitmapIndex=false "$@"; }

# strip OLD NEW: NEW (absent) becomes OLD's git dir with only what MODE keeps
strip() {
    old=$1 new=$2
    head=$(g --git-dir="$old" rev-parse -q --verify 'HEAD^{commit}' 2>/dev/null) || head=
    ref=$(g --git-dir="$old" symbolic-ref -q HEAD 2>/dev/null) || ref=
    common=$old
    [ ! -f "$old/commondir" ] || common=$(cd "$old" && cd "$(cat commondir)" && pwd)
    # hooks/ as git init leaves it, empty: the image's hooks stay behind, the agent may still write its own
    mkdir -p "$new/objects/pack" "$new/objects/info" "$new/refs/heads" "$new/refs/tags" "$new/info" "$new/hooks"
    [ ! -f "$common/config" ] || cp "$common/config" "$new/config"
    [ ! -f "$old/config.worktree" ] || cp "$old/config.worktree" "$new/config.worktree"
    # a linked worktree's config names its main repository's layout; ours is a repository of its own
    # (grep first: each git spawned is time every attempt pays)
    if [ -f "$new/config" ] && grep -qi 'refstorage\|partialclone\|bare *= *true' "$new/config"; then
        g config --file "$new/config" --unset-all extensions.refstorage 2>/dev/null || true
        g config --file "$new/config" --unset-all extensions.partialclone 2>/dev/null || true
        g config --file "$new/config" --bool core.bare false 2>/dev/null || true
    fi
    for f in info/exclude info/attributes info/sparse-checkout description; do
        [ ! -f "$common/$f" ] || cp "$common/$f" "$new/$f"
    done
    if [ -n "$head" ]; then
        case $mode in
            ancestry) printf '%s\n' "$head" | g --git-dir="$old" pack-objects --revs --quiet --delta-base-offset \
                          "$new/objects/pack/pack" > /dev/null
                      # a shallow image stays shallow where its ancestry ends
                      if [ -s "$common/shallow" ]; then
                          while IFS= read -r c; do
                              if g --git-dir="$old" merge-base --is-ancestor "$c" "$head" 2>/dev/null; then
                                  printf '%s\n' "$c"
                              fi
                          done < "$common/shallow" > "$new/shallow"
                          [ -s "$new/shallow" ] || rm -f "$new/shallow"
                      fi ;;
            # no delta search, light compression: this pack lives as long as the attempt
            head) g --git-dir="$old" rev-list --objects --no-walk "$head" | cut -d' ' -f1 \
                      | g --git-dir="$old" -c pack.compression=1 pack-objects --quiet --window=0 \
                          "$new/objects/pack/pack" > /dev/null
                  printf '%s\n' "$head" > "$new/shallow" ;;
        esac
        if [ -n "$ref" ]; then
            mkdir -p "$new/$(dirname "$ref")"
            printf '%s\n' "$head" > "$new/$ref"
        fi
    fi
    if [ -n "$ref" ]; then printf 'ref: %s\n' "$ref" > "$new/HEAD"
    elif [ -n "$head" ]; then printf '%s\n' "$head" > "$new/HEAD"
    else cp "$old/HEAD" "$new/HEAD"; fi
    # The index stays (its stat data spares the agent's first `git status` a rehash) when it is HEAD's;
    # one that stages anything else could stage the fix, so it is rebuilt from HEAD.
    if [ -f "$old/index" ] && [ -n "$head" ]; then
        if g --git-dir="$old" diff-index --cached --quiet "$head" -- 2>/dev/null \
                && ! ls "$old"/sharedindex.* > /dev/null 2>&1; then
            cp "$old/index" "$new/index"
        else
            g --git-dir="$new" read-tree "$head"
        fi
    fi
    chown -R "$(stat -c %u:%g "$old")" "$new"
}

is_gitdir() { [ -f "$1/HEAD" ] && [ -d "$1/objects" ]; }

# rebuild OLD NEW: strip, then OLD's submodules' git dirs (OLD/modules/..., at any depth: deepest first, each
# stripped where it is) move over to NEW
rebuild() {
    strip "$1" "$2"
    [ -d "$1/modules" ] || return 0
    # deepest first (no awk: not every image has one): each path prefixed by its count of slashes
    found=$(find "$1/modules" -type d -name objects | while IFS= read -r o; do
                s=$(printf '%s' "$o" | tr -cd /); printf '%s %s\n' "${#s}" "$o"; done | sort -rn | cut -d' ' -f2-)
    printf '%s\n' "$found" | while IFS= read -r o; do
        d=${o%/objects}
        if [ -n "$o" ] && is_gitdir "$d"; then replace "$d"; fi
    done
    mv "$1/modules" "$2/modules"
}

# replace GITDIR: a git dir swapped for its rebuilt self
replace() {
    rebuild "$1" "$1.agentrl-strip"
    rm -rf "$1"
    mv "$1.agentrl-strip" "$1"
}

top=$w/.git
if [ -f "$top" ]; then
    # A .git file points elsewhere (a linked worktree, an absorbed layout): the work tree gets a git dir of its
    # own, and the one it pointed to goes, with the history it kept (its main repository's too).
    pointed=$(sed -n 's/^gitdir: //p' "$top" | head -n 1)
    case $pointed in /*) ;; *) pointed=$w/$pointed ;; esac
    if [ -f "$pointed/HEAD" ] && { [ -d "$pointed/objects" ] || [ -f "$pointed/commondir" ]; }; then
        common=$pointed
        [ ! -f "$pointed/commondir" ] || common=$(cd "$pointed" && cd "$(cat commondir)" && pwd)
        rebuild "$pointed" "$top.agentrl-strip"
        rm -rf "$top" "$pointed" "$common"
        mv "$top.agentrl-strip" "$top"
        g config --file "$top/config" --unset core.worktree 2>/dev/null || true
    fi
elif is_gitdir "$top"; then
    replace "$top"
fi
# any other repository inside the work tree (a submodule not absorbed, a vendored clone)
others=$(find "$w" -path "$top" -prune -o -type d -name .git -print)
printf '%s\n' "$others" | while IFS= read -r d; do
    if [ -n "$d" ] && is_gitdir "$d"; then replace "$d"; fi
done
