#!/usr/bin/env bash
# Make sure the system tools agentrl-hpc needs are on this machine.
# As root on Debian/Ubuntu, install what is missing with apt; anywhere else,
# say what is missing and how a site usually provides it. Never tries apt as non-root.
set -euo pipefail

# command -> Debian package
declare -A pkg=(
  [sbatch]=slurm-client [slurmctld]=slurmctld [slurmd]=slurmd
  [munged]=munge [mungekey]=munge
  [bwrap]=bubblewrap
  [mkfs.ext4]=e2fsprogs [losetup]=mount       # the sandboxes' disk images (hpc/sandbox/storage.py)
  [glusterd]=glusterfs-server [glusterfs]=glusterfs-client   # a network filesystem (hpc/localcluster/glusterfs.py)
  [mpirun]=openmpi-bin [mpicc]=libopenmpi-dev
  [shellcheck]=shellcheck
  [buildah]=buildah [skopeo]=skopeo [docker-registry]=docker-registry [ch-image]=charliecloud-builders
  [ch-run]=charliecloud-runtime      # ch-image's import and RUN steps run ch-run
  [chromium]=chromium [chromedriver]=chromium-driver   # the viewer's browser tests (headless)
)
missing=()
for cmd in "${!pkg[@]}"; do command -v "$cmd" >/dev/null || missing+=("$cmd"); done
# The bwrap sandboxes' supervisor runs on the system Python with libseccomp's binding.
pkg[python3-seccomp]=python3-seccomp
/usr/bin/python3 -c 'import seccomp' 2>/dev/null || missing+=(python3-seccomp)
# charliecloud's ch-image runs on the system Python too, with Debian's lark and requests.
pkg[python3-lark]=python3-lark pkg[python3-requests]=python3-requests
/usr/bin/python3 -c 'import lark' 2>/dev/null || missing+=(python3-lark)
/usr/bin/python3 -c 'import requests' 2>/dev/null || missing+=(python3-requests)
# The base image of the mutations tests with --with: the host's Python and Debian's pip (tests/test_task_mutations_deps.py).
pkg[python3-pip]=python3-pip
[[ -d /usr/lib/python3/dist-packages/pip ]] || missing+=(python3-pip)
((${#missing[@]} == 0)) && exit 0

pkgs=$(for c in "${missing[@]}"; do echo "${pkg[$c]}"; done | sort -u | tr '\n' ' ')
if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
  echo "sysdeps: installing $pkgs"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # Debian's postinst scripts try to start the daemons; the local cluster starts its own.
  apt-get install -y -qq --no-install-recommends $pkgs >/dev/null
  exit 0
fi

cat >&2 <<MSG
sysdeps: missing system tools: ${missing[*]}
  As root on Debian/Ubuntu: apt-get install $pkgs
  On a cluster these usually come from the site, not from you:
    - Slurm clients (sbatch, srun): already on login nodes, or \`module load slurm\`.
    - slurmctld/slurmd/munged are only needed for the local test cluster (make cluster-up);
      on a real cluster, skip it and run the tests that need no Slurm: make test-unit.
    - bubblewrap (bwrap) and python3-seccomp (the bwrap sandboxes' supervisor): ask your admins,
      or use the apptainer sandbox runtime (\`module load apptainer\`), which most HPC sites provide.
    - MPI (mpirun, mpicc): sites provide it with \`module load openmpi\`; load it before
      installing and running mpi4py (pip install 'agentrl-hpc[mpi]'), which uses the MPI it finds.
    - buildah and skopeo (building tasks' Dockerfiles, pulling images): packaged by Debian 12 and
      RHEL 8+; or Apptainer (\`module load apptainer\`), or charliecloud (unprivileged, with its
      limits: docs/sandbox.md). docker-registry is only for the tests (a loopback registry).
    - chromium and chromedriver are only for the browser tests of \`agentrl view\` (tests/test_view_browser.py).
MSG
exit 1
