"""A matrix kept as the product of its two factors, A @ B, as TransformerLens's FactoredMatrix keeps
one.

A head's circuits are products of its weights: its OV circuit W_V W_O is d_model x d_model but of
rank d_head, and W_E W_V W_O W_U, the full OV circuit between tokens, is d_vocab x d_vocab (2.5
billion numbers for GPT-2) of the same rank. `Factored(A, B)` holds A (..., m, k) and B (..., k, n)
and answers from the small k x k matrices what the big one would say: its Frobenius norm from the
Gram matrices A^T A and B B^T, its nonzero eigenvalues from B A, products that stay factored.
Leading dimensions (layers, heads) broadcast, so every head is one batched call. `full()` forms the
matrix itself: only when it is small.
"""

from __future__ import annotations

from typing import Union

import torch

# numbers of the k x k products held at once in composition_scores (128 MB in float64)
PAIR_NUMBERS = 1 << 24


class Factored:
    """The matrix A @ B: A (..., m, k), B (..., k, n), never formed unless `full()` is called."""

    def __init__(self, A: torch.Tensor, B: torch.Tensor):
        if A.size(-1) != B.size(-2):
            raise ValueError(f"factors do not chain: A is {tuple(A.shape)}, B is {tuple(B.shape)}")
        self.A = A
        self.B = B

    @property
    def shape(self) -> tuple[int, ...]:
        batch = torch.broadcast_shapes(self.A.shape[:-2], self.B.shape[:-2])
        return (*batch, self.A.size(-2), self.B.size(-1))

    @property
    def T(self) -> Factored:
        """The transpose, B^T A^T."""
        return Factored(self.B.transpose(-2, -1), self.A.transpose(-2, -1))

    def __matmul__(self, other: Union[Factored, torch.Tensor]) -> Factored:
        """(A B) X: the inner dimension stays k (B X is formed, k x X's columns)."""
        if isinstance(other, Factored):
            return Factored(self.A, (self.B @ other.A) @ other.B)
        return Factored(self.A, self.B @ other)

    def __rmatmul__(self, other: torch.Tensor) -> Factored:
        """X (A B) = (X A) B."""
        return Factored(other @ self.A, self.B)

    def full(self) -> torch.Tensor:
        """The matrix itself, (..., m, n): only for small ones."""
        return self.A @ self.B

    def rows(self, index) -> torch.Tensor:
        """Some rows of the matrix, formed: A[..., index, :] @ B."""
        return self.A[..., index, :] @ self.B

    def gram(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(A^T A, B B^T), each (..., k, k): the Frobenius norm of A M B is sqrt(sum((G_A M) * (M
        G_B)))."""
        return self.A.transpose(-2, -1) @ self.A, self.B @ self.B.transpose(-2, -1)

    def norm(self) -> torch.Tensor:
        """The Frobenius norm of A B, (...,), from k x k matrices: ||A B||^2 = sum(A^T A * B
        B^T)."""
        left, right = self.gram()
        return (left * right).sum(dim=(-2, -1)).clamp(min=0).sqrt()

    def eigenvalues(self) -> torch.Tensor:
        """The k eigenvalues of B A (complex, (..., k)): the nonzero eigenvalues of the square A B
        are among them, and the rest of A B's are 0."""
        if self.A.size(-2) != self.B.size(-1):
            raise ValueError(f"eigenvalues need a square matrix, this one is {self.shape}")
        return torch.linalg.eigvals(self.B @ self.A)


def composition_scores(left: Factored, right: Factored) -> torch.Tensor:
    """||L R||_F / (||L||_F ||R||_F) for every pair of a batch of left matrices (P, m, m) and right
    matrices (Q, m, m), each factored (rank k): (P, Q). The products are never formed: with
    L = A_L B_L and R = A_R B_R, L R = A_L M B_R with M = B_L A_R (k x k per pair), and
    ||A M B||^2 = sum((G_A M) * (M G_B)) with the Gram matrices of `Factored.gram`."""
    gram_left, _ = left.gram()  # A_L^T A_L: (P, k, k)
    _, gram_right = right.gram()  # B_R B_R^T: (Q, k2, k2)
    (P, k) = left.B.shape[:2]
    (Q, k2) = (right.A.shape[0], right.A.shape[2])
    readers = right.A.transpose(0, 1).reshape(-1, Q * k2)  # (m, Q k2): every A_R side by side
    chunk = max(1, PAIR_NUMBERS // (Q * k * k2))  # left matrices at a time: bounded memory
    products = []
    for p in range(0, P, chunk):
        B = left.B[p : p + chunk]
        # B_L A_R
        M = (B.reshape(-1, B.size(-1)) @ readers).view(B.size(0), k, Q, k2).transpose(1, 2)
        products.append(
            ((gram_left[p : p + chunk, None] @ M) * (M @ gram_right[None])).sum(dim=(-2, -1))
        )
    norms = torch.cat(products).clamp(min=0).sqrt()
    return norms / (left.norm()[:, None] * right.norm()[None, :])
