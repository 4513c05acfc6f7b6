"""Network rules of the launchers and the doctor, one Python copy: which addresses are loopback, a
rendezvous host that only this machine reaches, this node's interfaces (getifaddrs), and the
interface NCCL picks for its bootstrap (NCCL_SOCKET_IFNAME's syntax, its order of preference).

Used by tools/launch.py (a --rdzv host refused before any rank starts) and tools/doctor.py (the
nccl-socket, gloo-socket, hostname and rendezvous checks). The C++ twin is lib/src/dist/launch.cpp:
the ranks' own refusals (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME naming no interface here, listing
the interfaces there are; the "each node met only itself" world). A rule changed here is changed
there too. Standard library only.
"""
import ctypes
import ctypes.util
import ipaddress
import os
import socket

# <net/if.h> flags as getifaddrs reports them.
IFF_UP, IFF_LOOPBACK, IFF_RUNNING = 0x1, 0x8, 0x40


class _SockAddr(ctypes.Structure):
    _fields_ = [("family", ctypes.c_ushort), ("data", ctypes.c_ubyte * 26)]


class _IfAddrs(ctypes.Structure):
    pass


_IfAddrs._fields_ = [("next", ctypes.POINTER(_IfAddrs)), ("name", ctypes.c_char_p), ("flags", ctypes.c_uint),
                     ("addr", ctypes.POINTER(_SockAddr)), ("netmask", ctypes.POINTER(_SockAddr)),
                     ("ifu", ctypes.c_void_p), ("data", ctypes.c_void_p)]


def read_interfaces():
    """Every IPv4/IPv6 address of this node's interfaces, in getifaddrs(3)'s order (the order NCCL
    walks): [{"name", "family": 4 or 6, "address", "flags"}], or {"error"}."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    head = ctypes.POINTER(_IfAddrs)()
    if libc.getifaddrs(ctypes.byref(head)) != 0:
        return {"error": f"getifaddrs: {os.strerror(ctypes.get_errno())}"}
    out = []
    try:
        p = head
        while p:
            ifa = p.contents
            if ifa.addr:
                family = ifa.addr.contents.family
                raw = bytes(ifa.addr.contents.data)
                # sockaddr_in: port (2 bytes) then the address; sockaddr_in6: port, flowinfo (4), address.
                if family == socket.AF_INET:
                    out.append({"name": ifa.name.decode(), "family": 4, "flags": ifa.flags,
                                "address": socket.inet_ntop(socket.AF_INET, raw[2:6])})
                elif family == socket.AF_INET6:
                    out.append({"name": ifa.name.decode(), "family": 6, "flags": ifa.flags,
                                "address": socket.inet_ntop(socket.AF_INET6, raw[6:22])})
            p = ifa.next
    finally:
        libc.freeifaddrs(head)
    return out


def resolve(host):
    """getaddrinfo's addresses of host for TCP, in its order (de-duplicated), or {"error"}."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        return {"error": str(e)}
    seen = []
    for info in infos:
        if info[4][0] not in seen:
            seen.append(info[4][0])
    return seen


def is_loopback(address):
    """Whether an address (IPv4, or IPv6 with or without a %scope) is a loopback one; False for a
    name or anything that is not an address."""
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


def loopback_problem(host, resolve=socket.getaddrinfo):
    """Why HOST cannot be a rendezvous for several machines, or None. A loopback IP
    written as such is accepted (all nodes on this machine); a name that resolves
    to one is the /etc/hosts trap. (tools/launch.py refuses such a --rdzv; lib/src/dist/launch.cpp
    names the same trap when the world comes out smaller than promised.)"""
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    try:
        addrs = {a[4][0] for a in resolve(host, None, proto=socket.IPPROTO_TCP)}
    except OSError as e:
        return f"--rdzv host {host!r} does not resolve here ({e.strerror or e}): use an address every node reaches"
    loop = sorted(a for a in addrs if is_loopback(a))
    if loop:
        return (f"--rdzv host {host!r} resolves to the loopback address {loop[0]} here (/etc/hosts?): the other "
                f"nodes cannot reach it, and each node would meet only itself. Give node 0's network address "
                f"(its IP on the interface the nodes share: `ip -brief addr`), and on node 0 add "
                f"--local-addr THAT_IP; tools/ember doctor --nnodes N --rdzv HOST:PORT checks it")
    return None


def usable_interfaces(interfaces):
    """The addresses NCCL would consider: up and running interfaces, IPv6 loopback skipped (NCCL's
    findInterfaces), in getifaddrs order."""
    return [i for i in interfaces if i["flags"] & IFF_UP and i["flags"] & IFF_RUNNING
            and not (i["family"] == 6 and is_loopback(i["address"]))]


def nccl_match(spec, names):
    """The interface names NCCL_SOCKET_IFNAME=spec selects among names, in their order. NCCL's syntax
    (src/misc/socket.cc, matchIfList): a comma-separated list of prefixes ("eth" matches eth0, eth1);
    a leading '^' excludes the list instead; then a leading '=' makes the names exact ("^=eth0")."""
    exclude = spec.startswith("^")
    if exclude:
        spec = spec[1:]
    exact = spec.startswith("=")
    if exact:
        spec = spec[1:]
    items = [s.split(":")[0] for s in spec.split(",") if s]  # NCCL also reads "name:port"
    out = []
    for name in names:
        hit = any(name == p if exact else name.startswith(p) for p in items)
        if hit != exclude and name not in out:
            out.append(name)
    return out


def nccl_socket_interfaces(interfaces, env):
    """(interfaces NCCL would use, in order, with their first address; how chosen). NCCL's
    ncclFindInterfaces: NCCL_SOCKET_IFNAME when it has more than one character (find or fail);
    else "ib" interfaces, then (with NCCL_COMM_ID) none here, then "^docker,lo,virbr", then docker,
    lo, virbr. NCCL_SOCKET_FAMILY=AF_INET/AF_INET6 keeps one family."""
    usable = usable_interfaces(interfaces)
    family = {"AF_INET": 4, "AF_INET6": 6}.get(env.get("NCCL_SOCKET_FAMILY", ""))
    if family:
        usable = [i for i in usable if i["family"] == family]
    names = []
    for i in usable:
        if i["name"] not in names:
            names.append(i["name"])
    first = {}
    for i in usable:
        first.setdefault(i["name"], i["address"])
    spec = env.get("NCCL_SOCKET_IFNAME", "")
    if len(spec) > 1:
        chosen = nccl_match(spec, names)
        return [(n, first[n]) for n in chosen], f"NCCL_SOCKET_IFNAME={spec}"
    for step in ("ib", "^docker,lo,virbr", "docker", "lo", "virbr"):
        chosen = nccl_match(step, names)
        if chosen:
            return [(n, first[n]) for n in chosen], f"NCCL's own choice ({step})"
    return [], "NCCL's own choice"
