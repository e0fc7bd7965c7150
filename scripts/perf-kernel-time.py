#!/usr/bin/env python3
"""Where a proxy's kernel time goes, per request, from `perf record -e cpu-clock -g`.

    perf record -e cpu-clock -F 2999 -g -p PID[,PID...] -o FILE.data -- wrk ...
    scripts/perf-kernel-time.py REQUESTS FILE.data [FILE.data ...]

REQUESTS is the number of requests the recorded runs served together (wrk's
count); the files' samples are added up. It prints the CPU a request (µs: a
cpu-clock sample's period is nanoseconds), user and kernel, and the kernel part
three ways:

- by system call: the kernel function do_syscall_64 called (ksys_write,
  __x64_sys_epoll_pwait, ...; prefixes dropped), so a write's time includes
  the loopback delivery to the reader on the other end, which the kernel does
  in the writer's context; samples outside a system call by their entry
  (asm_sysvec_apic_timer_interrupt: the timer; asm_exc_page_fault);
- by subsystem: the first of a few groups (scheduler, wake-ups, futex, epoll,
  TCP send and loopback receive, TCP receive, VFS and socket glue, timer and
  interrupts, page faults) that a frame of the chain belongs to, leaf first;
- by leaf function.

On a paravirtualised VM a large share of the leaf time is the interrupt
enable (pvm_irq_enable): a cpu-clock sample that falls while interrupts are
off is taken when they come back on, so that leaf also holds the time of the
sections that ran with interrupts off. The groups by system call and by
subsystem follow the chain, not the leaf, and are not skewed by it.
"""
import collections
import re
import subprocess
import sys

SUBSYSTEMS = [  # (group, frame regex): the first group a frame matches, leaf first
    ('scheduler (schedule, switch)', r'^(__schedule|schedule|finish_task_switch.*|pick_next_task.*|__switch_to.*)$'),
    ('wake-ups (try_to_wake_up)', r'^(try_to_wake_up|ttwu_.*|wake_up_q|__wake_up.*|sock_def_readable|ep_poll_callback)$'),
    ('futex', r'^(futex_.*|__futex.*)$'),
    ('epoll', r'^(ep_poll|ep_.*|do_epoll_.*)$'),
    ('tcp/ip send and loopback receive', r'^(tcp_sendmsg.*|tcp_write_xmit|__tcp_transmit_skb|ip_.*|__dev_queue_xmit|loopback_xmit|netif_.*|__netif.*|net_rx_action|tcp_v4_rcv|tcp_rcv_.*|__napi.*)$'),
    ('tcp receive', r'^(tcp_recvmsg.*|tcp_cleanup_rbuf|tcp_rcv_space_adjust|skb_copy_datagram.*)$'),
    ('vfs and socket glue', r'^(ksys_read|ksys_write|vfs_read|vfs_write|sock_read_iter|sock_write_iter|__sys_recvfrom|sock_recvmsg|sock_sendmsg|do_writev|do_iter_.*|__fdget.*|fdget.*)$'),
    ('timer and interrupts', r'^(asm_sysvec_.*|sysvec_.*|hrtimer_.*|__sysvec.*|irq_exit.*|__irq_exit.*)$'),
    ('page faults', r'^(asm_exc_page_fault|exc_page_fault|handle_mm_fault)$'),
]
SUBSYSTEM_RES = [(name, re.compile(rx)) for name, rx in SUBSYSTEMS]
FRAME = re.compile(r'^\s*[0-9a-f]+ (.*?)(?:\+0x[0-9a-f]+)? \((.*)\)$')


def samples(path):
    """Yields (period, [(symbol, in_kernel)...] leaf first) for each sample of path."""
    out = subprocess.run(['perf', 'script', '-i', path, '-F', 'period,ip,sym,dso'],
                         capture_output=True, text=True, check=True).stdout
    period, frames = None, []
    for line in out.split('\n'):
        m = FRAME.match(line)
        if m:
            frames.append((m.group(1), 'kernel' in m.group(2)))
            continue
        if period is not None and frames:
            yield period, frames
        period, frames = None, []
        head = line.split()
        if head and head[0].isdigit():
            period = int(head[0])
    if period is not None and frames:
        yield period, frames


def system_call(names):
    """The system call (or entry) a kernel chain, leaf first, ran under."""
    if 'do_syscall_64' in names:
        i = names.index('do_syscall_64')
        if i == 0:
            return 'system call entry and exit'
        if names[i - 1].endswith('irq_enable'):
            return 'system call entry (interrupts back on)'
        if names[i - 1] == 'exit_to_user_mode_loop':
            return 'return to user (a reschedule or signal first)'
        return re.sub(r'^(__x64_sys_|__do_sys_|__se_sys_|ksys_|__sys_|do_)', '', names[i - 1])
    return next((s for s in reversed(names) if s.startswith('asm_')), 'other: ' + names[-1])


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__.split('\n\n')[1])
    requests = float(sys.argv[1])
    total = collections.Counter()
    by_call, by_subsystem, by_leaf = collections.Counter(), collections.Counter(), collections.Counter()
    for path in sys.argv[2:]:
        for period, frames in samples(path):
            total['all'] += period
            if not frames[0][1]:
                total['user'] += period
                continue
            total['kernel'] += period
            names = [s for s, kernel in frames if kernel]
            by_call[system_call(names)] += period
            by_subsystem[next((g for s in names for g, rx in SUBSYSTEM_RES if rx.match(s)), 'entry, exit and the rest')] += period
            by_leaf[names[0]] += period

    def us(p):
        return p / 1e3 / requests
    kernel = total['kernel'] or 1
    print(f"{requests:.0f} requests; a request: CPU {us(total['all']):.2f} µs, user {us(total['user']):.2f}, kernel {us(total['kernel']):.2f}")
    for title, counts, n in (('kernel by system call', by_call, 14), ('kernel by subsystem', by_subsystem, 12),
                             ('kernel by leaf function', by_leaf, 14)):
        print(f'  {title} (µs a request, % of kernel):')
        for name, p in counts.most_common(n):
            print(f'    {us(p):6.2f}  {100 * p / kernel:5.1f} %  {name}')


if __name__ == '__main__':
    main()
